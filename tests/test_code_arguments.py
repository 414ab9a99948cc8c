"""README: "Arguments in code (`make_strategy("sync", backend="mirrored")`) rank with the
flags": above config files and the environment, and a code argument beats a flag given for the
same knob (it is the more specific request), while flags still set every other knob; and
``--helpfull`` lists a flag per knob with its default (and each mode's, where they differ)."""
import json
import re

import pytest

from tests.conftest import PYTHON, REPO, clean_env
from tfsync_testbed import localrun

SCRIPT = """
import json, sys
from absl import app
import tfsyncmodes

def main(argv):
    strategy = tfsyncmodes.make_strategy("sync", backend="mirrored")
    print(json.dumps({"mode": strategy.mode, "backend": strategy.backend,
                      "collective_timeout": strategy.config.collective_timeout, "sources": dict(strategy.config.sources)}))

app.run(main)
"""


@pytest.mark.timeout(120)
def test_make_strategy_arguments_rank_with_the_flags(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("mode: hybrid\nbackend: multi_worker\ncollective_timeout: 50\n")
    command = [PYTHON, "-c", SCRIPT, "--sync_mode=async", "--sync_collective_timeout=70", f"--sync_config={config}"]
    result = localrun.run(command, timeout=100, cwd=REPO,
                          env=clean_env(TFSYNC_MODE="hybrid", TFSYNC_BACKEND="horovod", TFSYNC_COLLECTIVE_TIMEOUT="60"))
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    # The code's mode and backend win over the flag, the environment and the file ...
    assert (got["mode"], got["backend"]) == ("sync", "mirrored")
    assert got["sources"]["mode"] == got["sources"]["backend"] == "argument"
    # ... and a knob the code does not set still comes from the flag, above the rest.
    assert got["collective_timeout"] == 70.0 and got["sources"]["collective_timeout"] == "flag"


def test_resolve_arguments_over_environment_and_file(tmp_path):
    import tfsyncmodes

    path = tmp_path / "c.yaml"
    path.write_text("mode: hybrid\ncollective_timeout: 60\n")
    resolved = tfsyncmodes.resolve({"mode": "async", "backend": None}, use_flags=False,
                                   environ={"TFSYNC_CONFIG": str(path), "TFSYNC_MODE": "sync"})
    assert resolved.mode == "async" and resolved.sources["mode"] == "argument"
    assert resolved.collective_timeout == 60.0 and resolved.sources["collective_timeout"] == f"config file {path}"
    assert resolved.backend == "auto" and resolved.sources["backend"] == "default"  # None: not given


@pytest.mark.timeout(120)
def test_helpfull_lists_a_flag_for_every_knob_with_its_defaults():
    from tfsyncmodes import knobs

    result = localrun.run([PYTHON, "scripts/train.py", "--helpfull"], timeout=100, cwd=REPO, env=clean_env())
    listed = result.stdout + result.stderr
    # absl's help: one block per flag, "  --name: help" (booleans "  --[no]name: help"), then
    # "(default: ...)" and the accepted values.
    blocks = {}
    for block in re.split(r"\n(?=  --)", listed):
        found = re.match(r"  --(?:\[no\])?(\w+):", block)
        if found:
            blocks[found.group(1)] = " ".join(block.split())
    assert "sync_config" in blocks and "TFSYNC_CONFIG" in blocks["sync_config"]
    for knob in knobs.KNOBS:
        block = blocks.get(knob.flag)
        assert block is not None, knob.flag
        shown = str(knob.default).lower() if isinstance(knob.default, bool) else str(knob.default)
        assert f"(default: {shown!r})" in block, (knob.flag, block)
        assert f"env {knob.env}" in block, block
        if knob.mode_defaults:  # e.g. "Default 2; hybrid: 7."
            per_mode = "; ".join(f"{mode}: {value}" for mode, value in knob.mode_defaults)
            assert f"Default {knob.default}; {per_mode}." in block, block
        if knob.parse.kind == "enum":
            assert f"<{'|'.join(knob.parse.choices)}>:" in block, block
    assert "--[no]sync_error_feedback:" in listed
