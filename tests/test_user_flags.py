"""A script's own flags beside tfsyncmodes': every knob's flag is --sync_<key>, so a user's
--config, --momentum or --compression (absl or argparse, defined before or after
``import tfsyncmodes``) keeps its own value and leaves the knobs alone; a --sync_* name another
module defined first is not adopted, and one line names both definitions."""
import json
import os

import pytest

from tests.conftest import PYTHON, REPO, clean_env
from tfsync_testbed import localrun

ABSL = """
import json, sys
from absl import flags
WHEN = sys.argv.pop(1)

def define():
    flags.DEFINE_string("config", "mine.yaml", "the script's own config")
    flags.DEFINE_float("momentum", 0.5, "the script's own momentum")
    flags.DEFINE_string("compression", "gzip", "the script's own compression")

if WHEN == "before":
    define()
import tfsyncmodes
if WHEN == "after":
    define()

def main(argv):
    knobs = tfsyncmodes.resolve()
    print(json.dumps({"user": [flags.FLAGS.config, flags.FLAGS.momentum, flags.FLAGS.compression],
                      "knobs": [knobs.compression, knobs.sources.get("compression", "default"), knobs.mode]}))

tfsyncmodes.run(main)
"""

ARGPARSE = """
import argparse, json, sys
WHEN = sys.argv.pop(1)
parser = argparse.ArgumentParser()

def define():
    parser.add_argument("--config", default="mine.yaml")
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--compression", default="gzip")

if WHEN == "before":
    define()
import tfsyncmodes
if WHEN == "after":
    define()
args, rest = parser.parse_known_args()
knobs = tfsyncmodes.resolve()
print(json.dumps({"user": [args.config, args.momentum, args.compression],
                  "knobs": [knobs.compression, knobs.sources.get("compression", "default"), knobs.mode]}))
"""

TAKEN = """
import json
from absl import flags
flags.DEFINE_string("sync_compression", "mine", "the script's own --sync_compression")
import tfsyncmodes

def main(argv):
    knobs = tfsyncmodes.resolve()
    print(json.dumps({"user": flags.FLAGS.sync_compression,
                      "knobs": [knobs.compression, knobs.sources.get("compression", "default")]}))

tfsyncmodes.run(main)
"""


def run_script(tmp_path, text, *args, **env):
    path = tmp_path / "user_script.py"
    path.write_text(text)
    result = localrun.run([PYTHON, str(path), *args], timeout=100, cwd=REPO, env=clean_env(**env))
    assert result.returncode == 0, result.stderr[-3000:]
    return str(path), json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["absl", "argparse"])
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_scripts_own_config_momentum_and_compression_flags(tmp_path, kind, when):
    _, got, stderr = run_script(tmp_path, ABSL if kind == "absl" else ARGPARSE, when, "--config=theirs.yaml",
                                "--momentum=0.25", "--compression=lz4", "--sync_compression=fp16", "--sync_mode=hybrid")
    assert got["user"] == ["theirs.yaml", 0.25, "lz4"]  # the script's values, as it parsed them
    # The knobs come from their own flags (no knob read theirs.yaml, which does not exist).
    assert got["knobs"] == ["fp16", "flag", "hybrid"]
    assert "is defined by" not in stderr


@pytest.mark.timeout(240)
def test_a_sync_flag_another_module_defined_first_is_not_adopted(tmp_path):
    path, got, stderr = run_script(tmp_path, TAKEN, "--sync_mode=sync")
    lines = [line for line in stderr.splitlines() if "--sync_compression is defined by" in line]
    assert len(lines) == 1, stderr[-3000:]
    assert f"--sync_compression is defined by {path} and by tfsyncmodes.flags" in lines[0]
    assert "so a --sync_compression given there sets both; to keep them apart, rename your flag" in lines[0]
    assert got == {"user": "mine", "knobs": ["none", "default"]}
    # The knob is read from tfsyncmodes' own parse of the command line; the script's flag keeps
    # its own definition (and parses the same text); the environment sets the knob alone.
    _, got, _ = run_script(tmp_path, TAKEN, "--sync_compression=fp16")
    assert got == {"user": "fp16", "knobs": ["fp16", "flag"]}
    _, got, _ = run_script(tmp_path, TAKEN, TFSYNC_COMPRESSION="topk")
    assert got == {"user": "mine", "knobs": ["topk", "environment"]}
    assert os.path.exists(path)
