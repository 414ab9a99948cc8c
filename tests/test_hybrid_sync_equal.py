"""Hybrid mode with staleness 0 and no compression, through the public API: with
``cross_group=stale`` the update is sync mode's (the mean gradient over all ranks), with SGD
and with Adam; ``periodic`` with period 1 averages the groups' models every step (local SGD,
its own NumPy reference)."""
import json
import os

import numpy as np
import pytest

from tests import reference
from tests.conftest import PYTHON, WORKERS, run_checked
from tfsync_testbed import localrun

# The module's tests share one job: on one pytest-xdist worker, which runs it once.
pytestmark = pytest.mark.xdist_group("hybrid-sync-equal-job")

STEPS = 4
# One horovodrun -np 4 job (groups of 2) trains every scenario in turn; the tests assert on it.
SCENARIOS = {
    "stale_sgd": {"compression": "none", "staleness": 0, "cross_group": "stale", "optimizer": "sgd"},
    "stale_adam": {"compression": "none", "staleness": 0, "cross_group": "stale", "optimizer": "adam"},
    "periodic_1": {"compression": "none", "period": 1, "cross_group": "periodic", "optimizer": "sgd"},
}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    outdir = tmp_path_factory.mktemp("hybrid_public")
    command = localrun.horovodrun_command(4, [PYTHON, os.path.join(WORKERS, "hybrid_public.py"), str(outdir),
                                              json.dumps(SCENARIOS), f"--steps={STEPS}"])
    run_checked(command, timeout=280, TFSYNC_GROUP_SIZE=2)
    return outdir


def run_hybrid(outdir, name):
    ranks = [np.load(outdir / f"{name}.rank{r}.npz") for r in range(4)]
    assert [list(g) for g in ranks[0]["groups"]] == [[0, 1], [2, 3]]
    assert all(int(r["iterations"]) == STEPS for r in ranks)
    # Ranks start from their own weights; the broadcast makes rank 0's everyone's start.
    assert np.abs(ranks[0]["kernel0"] - ranks[2]["kernel0"]).max() > 1e-3
    return ranks


def check(ranks, want, tolerance):
    for r in ranks:
        np.testing.assert_allclose(r["kernel"], want[0], rtol=0, atol=tolerance)
        np.testing.assert_allclose(r["bias"], want[1], rtol=0, atol=tolerance)
        np.testing.assert_array_equal(r["kernel"], ranks[0]["kernel"])  # one model at the end


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.timeout(330)
def test_stale_with_staleness_0_and_no_compression_equals_sync(job, optimizer):
    ranks = run_hybrid(job, f"stale_{optimizer}")
    x, y = reference.linear_data(STEPS, 4)
    check(ranks, reference.mean_gradient_training(ranks[0]["kernel0"], ranks[0]["bias0"], x, y, optimizer),
          tolerance=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(330)
def test_periodic_with_period_1_and_no_compression_averages_every_step(job):
    knobs = {k: v for k, v in SCENARIOS["periodic_1"].items() if k != "optimizer"}
    ranks = run_hybrid(job, "periodic_1")
    x, y = reference.linear_data(STEPS, 4)
    want = reference.hybrid_training(ranks[0]["kernel0"], ranks[0]["bias0"], x, y, [[0, 1], [2, 3]], **knobs)
    check(ranks, want[0], tolerance=1e-6)
