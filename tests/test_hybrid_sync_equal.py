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

STEPS = 4


def run_hybrid(tmp_path, knobs, optimizer):
    command = localrun.horovodrun_command(4, [PYTHON, os.path.join(WORKERS, "hybrid_public.py"), str(tmp_path),
                                              json.dumps(knobs), f"--steps={STEPS}", f"--optimizer={optimizer}"])
    run_checked(command, timeout=200, TFSYNC_GROUP_SIZE=2)
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(4)]
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
@pytest.mark.timeout(240)
def test_stale_with_staleness_0_and_no_compression_equals_sync(tmp_path, optimizer):
    knobs = {"compression": "none", "staleness": 0, "cross_group": "stale"}
    ranks = run_hybrid(tmp_path, knobs, optimizer)
    x, y = reference.linear_data(STEPS, 4)
    check(ranks, reference.mean_gradient_training(ranks[0]["kernel0"], ranks[0]["bias0"], x, y, optimizer),
          tolerance=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_periodic_with_period_1_and_no_compression_averages_every_step(tmp_path):
    knobs = {"compression": "none", "period": 1, "cross_group": "periodic"}
    ranks = run_hybrid(tmp_path, knobs, "sgd")
    x, y = reference.linear_data(STEPS, 4)
    want = reference.hybrid_training(ranks[0]["kernel0"], ranks[0]["bias0"], x, y, [[0, 1], [2, 3]], **knobs)
    check(ranks, want[0], tolerance=1e-6)
