"""Streaming periodic averaging (``--sync_fragments``): a ``horovodrun -np 4`` job (2 groups of
2, local steps fixed) trains every scenario of hybrid_jobs.STREAMING_JOB once; its weights equal
a NumPy replay of the fragment schedule, each exchange carries one fragment's bytes, and
fragments=1 is periodic averaging bit for bit. Bad combinations are refused in one line."""
import math

import numpy as np
import pytest

from tests import reference
from tests.hybrid_jobs import FIXED_STEPS, STREAMING, STREAMING_JOB, run_scenarios
from tests.reference_streaming import fragment_bounds, streaming_training
from tfsyncmodes import config as config_lib
from tfsyncmodes.errors import ConfigError

SIZE = reference.FEATURES * reference.OUTPUTS + reference.OUTPUTS  # 18 entries
_DONE = {}
# The tests of the shared job run on one pytest-xdist worker, which runs the job once.
SHARED = pytest.mark.xdist_group("hybrid-streaming-job")
# (step, fragment) of each round by the documented rule, written out: period 4, fragment p after
# the steps p * 4 / K + 4j; the warm-up's step 1 averages the whole model.
SCHEDULES = {"streaming_2_average": [(2, 1), (4, 0), (6, 1), (8, 0)],
             "streaming_4_nesterov": [(1, 1), (2, 2), (3, 3), (4, 0), (5, 1), (6, 2), (7, 3), (8, 0)],
             "streaming_2_topk_nesterov": [(1, "whole"), (2, 1), (4, 0), (6, 1), (8, 0)]}


def streaming_job(tmp_path_factory):
    if "job" not in _DONE:
        _DONE["job"] = run_scenarios(tmp_path_factory.mktemp("hybrid_streaming"), STREAMING_JOB, 4,
                                     TFSYNC_GROUP_SIZE=2)
    return _DONE["job"]


def payload_bytes(entries, knobs, position=None):
    """Bytes one rank sends for `entries` entries: Top-K's k values + k int32 indices, or float32;
    a dense payload goes in slices across the groups, rank j of a group of 2 sending the j-th
    (`position`; None: the whole payload, as one group sends it)."""
    if knobs["compression"] == "topk":
        return 8 * max(1, math.ceil(knobs["topk_ratio"] * entries - 1e-9))
    if position is None:
        return 4 * entries
    return 4 * (entries * (position + 1) // 2 - entries * position // 2)


def replay(workers, knobs):
    x, y = reference.linear_data(knobs["steps"], 4)
    options = {k: v for k, v in knobs.items() if k in ("compression", "topk_ratio", "warmup_steps", "outer_optimizer",
                                                        "outer_lr", "outer_momentum")}
    groups = [list(g) for g in workers[0]["groups"]]
    return streaming_training(workers[0]["kernel0"], workers[0]["bias0"], x, y, groups, knobs["period"],
                              knobs["fragments"], **options)


@pytest.mark.slow  # horovodrun -np 4
@pytest.mark.timeout(900)
@SHARED
def test_streaming_fragments_equal_numpy_and_send_one_fragment_per_exchange(tmp_path_factory):
    results = streaming_job(tmp_path_factory)
    for name in ("streaming_2_average", "streaming_4_nesterov", "streaming_2_topk_nesterov"):
        knobs, workers = STREAMING[name], results[name]
        steps, count = knobs["steps"], knobs["fragments"]
        want, apart, rounds = replay(workers, knobs)
        for w in workers:
            assert int(w["iterations"]) == steps
            np.testing.assert_allclose(w["kernel"], want[int(w["group"])][0], rtol=0, atol=1e-6, err_msg=name)
            np.testing.assert_allclose(w["bias"], want[int(w["group"])][1], rtol=0, atol=1e-6, err_msg=name)
            np.testing.assert_array_equal(w["kernel"], workers[0]["kernel"])  # one model at the end
        # The staggered schedule mattered: the groups part before the final mean, and periodic
        # averaging of the whole model with the same knobs trains another model.
        assert np.abs(apart[0][0] - apart[1][0]).max() > 1e-4, name
        x, y = reference.linear_data(steps, 4)
        whole = reference.hybrid_training(workers[0]["kernel0"], workers[0]["bias0"], x, y, [[0, 1], [2, 3]],
                                          cross_group="periodic", **{k: v for k, v in knobs.items() if k not in (
                                              "fragments", "steps", "local_steps", "cross_group")})
        assert np.abs(whole[0][0] - want[0][0]).max() > 1e-4, name
        # The traffic counter after every step: a round's payload of the due fragment, 0 between.
        bounds = fragment_bounds(SIZE, count)
        assert rounds == SCHEDULES[name], rounds  # the replay follows the documented schedule
        totals = []
        for rank, w in enumerate(workers):
            expected = [0] * steps
            for step, fragment in rounds:
                entries = SIZE if fragment == "whole" else bounds[fragment][1] - bounds[fragment][0]
                expected[step - 1] = payload_bytes(entries, knobs, position=rank % 2)  # groups [0, 1], [2, 3]
            assert list(w["step_bytes"]) == expected, (name, rank, list(w["step_bytes"]), expected)
            totals.append(sum(expected))
        for w in workers:  # the History's figure: the ranks' mean
            assert float(w["bytes_sent"]) == pytest.approx(np.mean(totals) / steps)
        # Peak bytes per exchange after the warm-up: one fragment's, about 1/K of the whole
        # model's (a dense fragment travels in its group's two slices: ranks 0 and 1 together).
        warm = knobs.get("warmup_steps", 0)
        mine, peer = list(workers[0]["step_bytes"]), list(workers[1]["step_bytes"])
        sent = mine if knobs["compression"] == "topk" else [a + b for a, b in zip(mine, peer)]
        peak = max(sent[warm:])
        assert peak == payload_bytes(math.ceil(SIZE / count), knobs) < payload_bytes(SIZE, knobs)
        if knobs["compression"] == "none":
            assert peak / payload_bytes(SIZE, knobs) == pytest.approx(1 / count, abs=1 / SIZE)
            assert max(sent) == peak


@pytest.mark.slow
@pytest.mark.timeout(900)
@SHARED
def test_one_fragment_is_periodic_averaging_bit_for_bit(tmp_path_factory):
    results = streaming_job(tmp_path_factory)
    assert STREAMING["streaming_1"] == dict(FIXED_STEPS["periodic_period_3"], fragments=1)
    for one, periodic in zip(results["streaming_1"], results["periodic_period_3"]):
        for key in ("kernel", "bias", "kernel0", "bias0", "step_bytes"):
            np.testing.assert_array_equal(one[key], periodic[key])
    assert np.abs(results["streaming_1"][0]["kernel"] - results["streaming_1"][0]["kernel0"]).max() > 1e-3


@pytest.mark.parametrize("knobs, words", [
    ({"fragments": 4, "period": 2}, ["argument: fragments: 4 is above the period 2", "use 1 to 2"]),
    ({"fragments": 2, "local_steps": "auto"}, ["argument: local_steps: auto cannot run with fragments=2",
                                                "use fixed, or fragments=1"]),
])
def test_fragments_that_cannot_run_are_one_clear_error(knobs, words):
    from tfsyncmodes.exchange import knob_settings

    config = config_lib.resolve(dict(knobs, mode="hybrid"), environ={}, use_flags=False)
    with pytest.raises(ConfigError) as raised:
        knob_settings.fragments(config)
    assert len(str(raised.value).splitlines()) == 1
    for word in words:
        assert word in str(raised.value)
    # local_steps left at its default is fixed under fragments, not refused.
    fine = config_lib.resolve({"mode": "hybrid", "fragments": 2, "period": 2}, environ={}, use_flags=False)
    assert knob_settings.fragments(fine) == 2 and fine.local_steps == "auto"
