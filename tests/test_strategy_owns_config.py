"""The strategy owns the configuration: wrap() in its scope follows the strategy made from the
command line of a script that never parsed absl flags (outside every scope, a hybrid wrap without
the strategy's groups is an error); a contradicting mode is an error; the exchange's
state is optimizer state that model.save / load_model carry into a fresh job."""
import json
import os

import numpy as np
import pytest

from tests.conftest import PYTHON, WORKERS, run_checked
from tfsync_testbed import localrun


def results(stdout):
    return sorted((json.loads(line.split("RESULT ", 1)[1]) for line in stdout.splitlines()
                   if "RESULT " in line), key=lambda r: r["rank"])


@pytest.mark.slow  # horovodrun jobs
@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
@pytest.mark.timeout(200)
def test_argparse_script_under_horovodrun_wraps_in_the_strategys_mode(legacy):
    command = localrun.horovodrun_command(2, [PYTHON, os.path.join(WORKERS, "wrap_in_strategy.py"),
                                              "--sync_mode=hybrid", "--sync_group_size=1", "--epochs", "3"])
    out = results(run_checked(command, timeout=170, TF_USE_LEGACY_KERAS=int(legacy)).stdout)
    assert [r["rank"] for r in out] == [0, 1]
    for r in out:
        assert r["strategy_mode"] == "hybrid" and r["sources"]["mode"] == "flag"
        assert r["group_size"] == 1 and r["sources"]["group_size"] == "flag"
        assert r["in_scope"] == r["outside"] == "hybrid" and r["same_config"]
        assert r["epochs"] == 3  # the script's own argument survives
        assert r["class"] == ("SyncSGD" if legacy else "SyncOptimizer")
        assert "'sync'" in r["contradiction"] and "'hybrid'" in r["contradiction"]
        assert "no hybrid strategy's scope is active" in r["unscoped"]


@pytest.mark.slow  # horovodrun jobs
@pytest.mark.timeout(300)
def test_hybrid_state_saved_mid_training_resumes_exactly_in_a_fresh_job(tmp_path):
    env = {"TFSYNC_GROUP_SIZE": 2, "TFSYNC_COMPRESSION": "topk", "TFSYNC_TOPK_RATIO": 0.25,
           "TFSYNC_PERIOD": 2, "TFSYNC_CROSS_GROUP": "periodic", "TFSYNC_LOCAL_STEPS": "fixed"}
    for phase in ("train", "resume"):
        run_checked(localrun.horovodrun_command(4, [PYTHON, os.path.join(WORKERS, "hybrid_resume.py"),
                                                    str(tmp_path), phase]), timeout=240, **env)
    saved = np.load(tmp_path / "saved.npz")
    names = list(saved.keys())
    residual = [k for k in names if "error_feedback_residual" in k]
    anchor = [k for k in names if "local_sgd_anchor" in k]
    step = [k for k in names if "local_sgd_step" in k]
    assert len(residual) == len(anchor) == len(step) == 1, names
    assert np.abs(saved[residual[0]]).max() > 1e-4  # Top-K left something behind
    assert int(saved[step[0]]) == 3
    for rank in range(4):
        resumed, continued = np.load(tmp_path / f"resume.rank{rank}.npz"), np.load(tmp_path / f"train.rank{rank}.npz")
        for name in names:  # load_model restored every variable of the exchange, by position
            np.testing.assert_array_equal(resumed[name], saved[name])
        assert int(resumed["iterations"]) == int(continued["iterations"]) == 4
        for i in range(2):  # the step after the resume is the step of a run that never stopped
            np.testing.assert_array_equal(resumed[f"arr_{i}"], continued[f"arr_{i}"])


@pytest.mark.slow  # horovodrun jobs
@pytest.mark.parametrize("mode", ["sync", "hybrid"])
@pytest.mark.timeout(200)
def test_wrap_under_horovodrun_with_no_strategy_is_one_line_not_ranks_training_alone(mode):
    command = localrun.horovodrun_command(2, [PYTHON, os.path.join(WORKERS, "wrap_without_strategy.py"),
                                              f"--sync_mode={mode}"])
    result = localrun.run(command, timeout=170)
    assert result.returncode != 0 and "TRAINED" not in result.stdout, result.stdout[-2000:]
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "tfsyncmodes: error:" in line]
    for rank in (0, 1):  # each rank's one line, and no traceback
        mine = [line for line in errors if f"this is rank {rank} of a 2-rank horovodrun job" in line]
        assert len(mine) == 1, errors
        assert f"wrap: mode={mode}: " in mine[0] and "call tfsyncmodes.make_strategy() first" in mine[0]
    ranks = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith(("[0]<", "[1]<"))]
    assert ranks and not [line for line in ranks if "Traceback" in line]  # (horovodrun's own report has one)
