"""Hybrid ``stale`` in a run that really lags: rank 2 is slowed (``--sync_slow_worker``), so the
other group runs ahead and applies the slow group's rounds late; each late round must count
1/(1+steps late) (``staleness_aware_lr``, on by default), as the NumPy reference replays from
the recorded schedule."""
import numpy as np
import pytest

from tests import reference
from tests.hybrid_jobs import run_scenarios
from tests.test_hybrid import check_against_numpy, rounds_schedule

STEPS = 8
KNOBS = {"compression": "topk", "topk_ratio": 0.25, "staleness": 2, "cross_group": "stale"}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_late_rounds_are_discounted_in_a_run_that_lags(tmp_path):
    results = run_scenarios(tmp_path, {"lagging": KNOBS}, STEPS, TFSYNC_GROUP_SIZE=2,
                            TFSYNC_SLOW_WORKER="2:10")
    workers = results["lagging"]
    schedule = rounds_schedule(workers, KNOBS, STEPS)  # also checks the bound s = 2
    late = [done + 1 - applied for counts in schedule for done, applied in enumerate(counts)]
    assert max(late) >= 1, schedule  # some round was applied at least a step late
    check_against_numpy(workers, KNOBS, STEPS, tolerance=1e-6)
    # Without the discount the same schedule gives other weights: the discount was applied.
    x, y = reference.linear_data(STEPS, 4)
    undiscounted = reference.hybrid_training(workers[0]["kernel0"], workers[0]["bias0"], x, y,
                                             [[0, 1], [2, 3]], schedule=schedule, staleness_aware_lr=False,
                                             **KNOBS)
    assert np.abs(workers[0]["kernel"] - undiscounted[0][0]).max() > 1e-4
