"""Hybrid mode with an exchange composed in Python from typed parts (``cross_group_link``,
``hybrid_chain``, ``PeriodicAverage``, ``TopK``, ``NesterovOuter``) and passed as
``strategy.wrap(optimizer, exchange=...)``: under ``horovodrun -np 4`` (groups of 2) it equals
the exchange the knobs build, bit for bit, and with its own settings the NumPy reference."""
import numpy as np
import pytest

from tests import reference
from tests.test_hybrid import SCENARIOS, check_against_numpy, numpy_knobs, run_scenarios

STEPS = 4
# Periodic averaging with Top-K composed by hand (tests/workers/hybrid_steps.py's
# composed_exchange): once with the settings the knobs of periodic_topk give (period 2, ratio
# 0.25), once with its own period 3 and outer Nesterov step, none of which the strategy's knobs
# say (hybrid's defaults).
COMPOSED = {
    "knobs_periodic_topk": SCENARIOS["periodic_topk"],
    "composed_periodic_topk": {"composed": {"period": 2, "topk_ratio": 0.25}},
    "composed_period_3_nesterov": {"composed": {"period": 3, "topk_ratio": 0.25, "outer": "nesterov",
                                                "outer_lr": 0.5, "outer_momentum": 0.8}},
}
# What the last one trains, in the reference's knobs.
PERIOD_3_NESTEROV = {"compression": "topk", "topk_ratio": 0.25, "period": 3, "cross_group": "periodic",
                     "outer_optimizer": "nesterov", "outer_lr": 0.5, "outer_momentum": 0.8, "local_steps": "fixed"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hybrid_exchange_composed_in_python_equals_the_knobs_and_numpy(tmp_path):
    results = run_scenarios(tmp_path, COMPOSED, STEPS, TFSYNC_GROUP_SIZE=2)
    for knobs_built, composed in zip(results["knobs_periodic_topk"], results["composed_periodic_topk"]):
        for key in ("kernel", "bias", "kernel0", "bias0"):
            np.testing.assert_array_equal(composed[key], knobs_built[key])
        assert float(composed["bytes_sent"]) == float(knobs_built["bytes_sent"])
    # Period 3: a round after update 3 (of 4), each group alone after it, then the final mean.
    workers = results["composed_period_3_nesterov"]
    want = check_against_numpy(workers, PERIOD_3_NESTEROV, STEPS, tolerance=1e-6)
    x, y = reference.linear_data(STEPS, 4)
    groups = [list(g) for g in workers[0]["groups"]]
    for other in (dict(PERIOD_3_NESTEROV, period=2), dict(PERIOD_3_NESTEROV, outer_optimizer="average")):
        elsewhere = reference.hybrid_training(workers[0]["kernel0"], workers[0]["bias0"], x, y, groups,
                                              **numpy_knobs(other))
        assert np.abs(elsewhere[0][0] - want[0][0]).max() > 1e-4  # the composed settings mattered
