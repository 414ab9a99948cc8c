"""Hybrid mode with an exchange composed in Python from typed parts (``cross_group_link``,
``hybrid_chain``, ``PeriodicAverage``, ``TopK``, ``NesterovOuter``) and passed as
``strategy.wrap(optimizer, exchange=...)``: under ``horovodrun -np 4`` (groups of 2) it equals
the exchange the knobs build, bit for bit, and with its own settings the NumPy reference."""
import numpy as np
import pytest

from tests import reference
from tests.hybrid_jobs import COMPOSED, KERAS3_JOB, KERAS3_SHARED, KERAS3_STEPS, SCENARIOS, keras3_job
from tests.test_hybrid import check_against_numpy, numpy_knobs

STEPS = KERAS3_STEPS
# The composed scenarios (hybrid_jobs.COMPOSED) run in the shared Keras 3 job, beside
# periodic_topk built by the knobs. The last one trains, in the reference's knobs:
PERIOD_3_NESTEROV = {"compression": "topk", "topk_ratio": 0.25, "period": 3, "cross_group": "periodic",
                     "outer_optimizer": "nesterov", "outer_lr": 0.5, "outer_momentum": 0.8, "local_steps": "fixed"}


@pytest.mark.slow
@pytest.mark.timeout(600)
@KERAS3_SHARED
def test_hybrid_exchange_composed_in_python_equals_the_knobs_and_numpy(tmp_path_factory):
    assert set(COMPOSED) <= set(KERAS3_JOB) and KERAS3_JOB["periodic_topk"] == SCENARIOS["periodic_topk"]
    results = keras3_job(tmp_path_factory)
    for knobs_built, composed in zip(results["periodic_topk"], results["composed_periodic_topk"]):
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
