"""README: "Arguments in code (`make_strategy("sync", backend="mirrored")`) rank with the
flags": above config files and the environment, and a code argument beats a flag given for the
same knob (it is the more specific request), while flags still set every other knob; and
``--helpfull`` lists a flag per knob."""
import json

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
                      "staleness": strategy.config.staleness, "sources": dict(strategy.config.sources)}))

app.run(main)
"""


@pytest.mark.timeout(120)
def test_make_strategy_arguments_rank_with_the_flags(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("mode: hybrid\nbackend: multi_worker\nstaleness: 5\n")
    command = [PYTHON, "-c", SCRIPT, "--sync_mode=async", "--staleness=7", f"--config={config}"]
    result = localrun.run(command, timeout=100, cwd=REPO,
                          env=clean_env(TFSYNC_MODE="hybrid", TFSYNC_BACKEND="horovod", TFSYNC_STALENESS="6"))
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    # The code's mode and backend win over the flag, the environment and the file ...
    assert (got["mode"], got["backend"]) == ("sync", "mirrored")
    assert got["sources"]["mode"] == got["sources"]["backend"] == "argument"
    # ... and a knob the code does not set still comes from the flag, above the rest.
    assert got["staleness"] == 7 and got["sources"]["staleness"] == "flag"


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
def test_helpfull_lists_a_flag_for_every_knob():
    result = localrun.run([PYTHON, "scripts/train.py", "--helpfull"], timeout=100, cwd=REPO, env=clean_env())
    listed = result.stdout + result.stderr
    for flag in ("--sync_mode", "--sync_backend", "--sync_collective_timeout", "--slow_worker", "--clip_norm",
                 "--group_size", "--topk_ratio", "--staleness", "--ps_shards", "--cross_group", "--config"):
        assert flag in listed, flag
