"""Hybrid mode: compressors and error feedback against NumPy, group layouts and their bad
input, and real ``horovodrun -np 4`` jobs (2 groups of 2) checked against NumPy references."""
import json
import os

import numpy as np
import pytest

from tests import reference, reference_compression as ref
from tests.conftest import PYTHON, REPO, clean_env
from tests.hybrid_jobs import (AS_PERIODIC, AUTO_PARTIAL, AUTO_STEPS, ELASTIC, FIXED_STEPS, KERAS3, SCENARIOS,
                               KERAS3_SHARED, keras3_job, run_scenarios)
from tfsyncmodes import config as config_lib
from tfsync_testbed import localrun
from tfsyncmodes.errors import ConfigError

import tensorflow as tf  # noqa: E402  (a broken TensorFlow must fail these tests, not skip them)


# --- compressors and memory, in this process ----------------------------------------------

def ctx(size):
    from tfsyncmodes.exchange.flat import TensorContext

    return TensorContext("flat", (size,))


@pytest.mark.parametrize("size, ratio", [(18, 0.25), (1000, 0.01), (300_000, 0.01), (300_000, 0.001)])
def test_topk_selects_the_largest_entries_and_round_trips(size, ratio):
    from tfsyncmodes.exchange.compressors import TopK, payload_bytes

    flat = np.random.default_rng(size).standard_normal(size).astype(np.float32)
    compressor = TopK(ratio=ratio)
    values, indices = compressor.compress(tf.constant(flat), ctx(size))
    want_values, want_indices = reference.topk_compress(flat, ratio)
    assert indices.dtype == tf.int32 and len(indices) == len(want_indices) == compressor.k(size)
    assert set(indices.numpy().tolist()) == set(want_indices.tolist())
    np.testing.assert_array_equal(values.numpy(), flat[indices.numpy()])
    dense = compressor.decompress((values, indices), ctx(size)).numpy()
    np.testing.assert_array_equal(dense, reference.topk_decompress(want_values, want_indices, size))
    # Fewer bytes on the wire: k float32 values + k int32 indices instead of `size` floats.
    assert int(payload_bytes((values, indices))) == 8 * compressor.k(size) < 4 * size or ratio > 0.4


def test_topk_is_exact_when_the_sampled_threshold_keeps_too_few():
    from tfsyncmodes.exchange.compressors import TopK

    # Every sampled entry (stride 15) is large, so the threshold from the sample keeps about
    # 1.3 % of the sample's entries only: fewer than k, and the full top_k must take over.
    size = 300_000
    flat = np.random.default_rng(5).standard_normal(size).astype(np.float32)
    flat[::15] += 100.0
    compressor = TopK(ratio=0.01)
    values, indices = compressor.compress(tf.constant(flat), ctx(size))
    assert set(indices.numpy().tolist()) == set(reference.topk_compress(flat, 0.01)[1].tolist())
    np.testing.assert_array_equal(values.numpy(), flat[indices.numpy()])


def test_sparse_payloads_of_several_ranks_decompress_to_their_sum():
    from tfsyncmodes.exchange.compressors import TopK

    rng = np.random.default_rng(3)
    parts = [rng.standard_normal(500).astype(np.float32) for _ in range(3)]
    compressor = TopK(ratio=0.1)
    payloads = [compressor.compress(tf.constant(p), ctx(500)) for p in parts]
    concatenated = tuple(tf.concat([p[i] for p in payloads], 0) for i in range(2))
    want = sum(reference.topk_decompress(*reference.topk_compress(p, 0.1), 500) for p in parts)
    np.testing.assert_allclose(compressor.decompress(concatenated, ctx(500)).numpy(), want, rtol=0, atol=1e-6)


def test_fp16_round_trip_is_within_its_bound_and_halves_the_bytes():
    from tfsyncmodes.exchange.compressors import FP16, payload_bytes

    flat = (np.random.default_rng(5).standard_normal(10_000) * 10.0 ** np.random.default_rng(6).uniform(
        -4, 3.5, 10_000)).astype(np.float32)
    compressor = FP16()
    payload = compressor.compress(tf.constant(flat), ctx(flat.size))
    back = compressor.decompress(payload, ctx(flat.size)).numpy()
    np.testing.assert_array_equal(back, flat.astype(np.float16).astype(np.float32))
    normal = np.abs(flat) >= 2.0 ** -14  # fp16's smallest normal number
    assert normal.sum() > 9000 and (~normal).sum() > 10
    assert np.all(np.abs(back - flat)[normal] <= 2.0 ** -11 * np.abs(flat)[normal])
    assert np.all(np.abs(back - flat)[~normal] <= 2.0 ** -25)  # half the subnormal spacing
    assert int(payload_bytes(payload)) == 2 * flat.size


@pytest.mark.parametrize("compression", ["topk", "fp16"])
def test_error_feedback_keeps_exactly_the_dropped_mass(compression):
    from tfsyncmodes.exchange import knob_settings

    config = config_lib.resolve({"compression": compression, "topk_ratio": 0.05}, environ={}, use_flags=False)
    compressor = knob_settings.compressor(config)
    residual = knob_settings.memory(config, compressor)
    flat = ctx(400)
    residual.build(flat, lambda name, shape, dtype: tf.Variable(tf.zeros(shape, dtype)))
    rng = np.random.default_rng(9)
    kept = np.zeros(400, np.float32)
    total_in, total_sent = np.zeros(400, np.float64), np.zeros(400, np.float64)
    for _ in range(5):
        update = rng.standard_normal(400).astype(np.float32)
        compensated = residual.compensate(tf.constant(update), flat)
        np.testing.assert_array_equal(compensated.numpy(), update + kept)
        payload = compressor.compress(compensated, flat)
        sent = compressor.decompress(payload, flat)
        residual.update(compensated, payload, compressor, flat)
        kept = residual.residual.numpy()
        np.testing.assert_array_equal(kept, compensated.numpy() - sent.numpy())
        if compression == "topk":  # sent entries leave nothing behind, the others stay whole
            chosen = payload[1].numpy()
            assert np.all(kept[chosen] == 0)
            others = np.setdiff1d(np.arange(400), chosen)
            np.testing.assert_array_equal(kept[others], compensated.numpy()[others])
        total_in += update
        total_sent += sent.numpy()
    np.testing.assert_allclose(total_sent + kept, total_in, rtol=0, atol=1e-5)


# --- groups and bad input ------------------------------------------------------------------

def layout(world, local=None, **knobs):
    from tfsyncmodes.exchange.groups import layout_from_config

    config = config_lib.resolve(knobs, environ={}, use_flags=False)
    return layout_from_config(config, world, local or world)


def test_group_layouts_and_their_columns():
    assert layout(4, group_size=2).groups == ((0, 1), (2, 3))
    assert layout(8, local=4).groups == ((0, 1, 2, 3), (4, 5, 6, 7))  # one group per host
    explicit = layout(4, groups="2,0;3,1")
    assert explicit.groups == ((0, 2), (1, 3))
    assert explicit.column_of(3) == (2, 3) and explicit.group_of(3) == 1
    assert explicit.process_set_ranks() == [[0, 2], [1, 3], [0, 1], [2, 3]]
    assert layout(4, groups=[[0, 1], [2, 3]]).groups == ((0, 1), (2, 3))


def test_one_group_of_every_rank_is_named_in_one_line_and_two_groups_are_not():
    from tfsyncmodes.exchange.groups import one_group_line

    def line(world, local=None, **knobs):
        config = config_lib.resolve(knobs, environ={}, use_flags=False)
        return one_group_line(layout(world, local, **knobs), config)

    assert line(4).startswith("tfsyncmodes: hybrid: one group of all 4 ranks (one group per host, on one host): "
                              "every step is one dense allreduce, as in sync; set --sync_group_size")
    assert "(group size 4)" in line(4, group_size=4)
    assert "(the groups listed are one)" in line(2, groups="0,1")
    assert line(4, group_size=2) is None and line(8, local=4) is None and line(1) is None


@pytest.mark.slow  # horovodrun -np 2
@pytest.mark.timeout(150)
def test_hybrid_on_one_host_with_one_group_per_host_says_so_once_and_trains():
    command = localrun.horovodrun_command(2, [PYTHON, os.path.join(REPO, "scripts", "train.py"),
                                              "--sync_mode=hybrid", "--epochs=1"])
    result = localrun.run(command, timeout=130, env=clean_env(), cwd=REPO)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    lines = [line for line in output.splitlines() if "hybrid: one group of all 2 ranks" in line]
    assert len(lines) == 1 and lines[0].startswith("[0]") and "(one group per host, on one host)" in lines[0], lines
    assert "test accuracy:" in output


@pytest.mark.parametrize("knobs, world, words", [
    ({"group_size": 3}, 4, ["argument", "group_size", "3 does not divide the world size 4", "divisor of 4"]),
    ({}, 6, ["local_size", "4 does not divide the world size 6"]),
    ({"groups": "0,1;2,5"}, 4, ["groups", "rank 5 does not exist in a world of 4", "ranks 0..3"]),
    ({"groups": "0,1;2"}, 4, ["groups", "rank 3 is in no group"]),
    ({"groups": "0,1,2;3"}, 4, ["groups", "different sizes (3, 1)", "same number of ranks"]),
])
def test_groups_that_do_not_fit_the_world(knobs, world, words):
    with pytest.raises(ConfigError) as raised:
        layout(world, local=4, **knobs)
    for word in words:
        assert word in str(raised.value)


@pytest.mark.parametrize("environ, words", [
    ({"TFSYNC_GROUPS": "0,1;;2,3"}, ["environment", "TFSYNC_GROUPS", "group 1", "is empty", "e.g. 0,1;2,3"]),
    ({"TFSYNC_GROUPS": "0,1;1,2"}, ["TFSYNC_GROUPS", "rank 1 is in group 0 and group 1", "exactly one group"]),
    ({"TFSYNC_GROUPS": "0,x"}, ["TFSYNC_GROUPS", "'x'", "not a rank"]),
    ({"TFSYNC_TOPK_RATIO": "0"}, ["TFSYNC_TOPK_RATIO", "out of range"]),
    ({"TFSYNC_COMPRESSION": "zip"}, ["TFSYNC_COMPRESSION", "none, fp16, topk"]),
    ({"TFSYNC_STALENESS": "-1"}, ["TFSYNC_STALENESS", "out of range"]),
    ({"TFSYNC_CROSS_GROUP": "gossip"}, ["TFSYNC_CROSS_GROUP", "stale, periodic"]),
    ({"TFSYNC_ELASTIC_ALPHA": "1.5"}, ["TFSYNC_ELASTIC_ALPHA", "out of range", "use auto or a number in (0, 1]"]),
    ({"TFSYNC_LOCAL_STEPS": "fast"}, ["TFSYNC_LOCAL_STEPS", "'fast'", "use one of: fixed, auto"]),
    ({"TFSYNC_PERIOD": "0"}, ["TFSYNC_PERIOD", "out of range", "[1, 1048576]"]),
])
def test_bad_hybrid_knobs_name_source_field_and_fix(environ, words):
    with pytest.raises(ConfigError) as raised:
        config_lib.resolve(environ=environ, use_flags=False)
    for word in words:
        assert word in str(raised.value)


def test_elastic_alpha_is_the_papers_by_default_and_keeps_the_center_within_the_groups():
    from tfsyncmodes.exchange.knob_settings import elastic_alpha

    assert config_lib.resolve({"cross_group": "elastic"}, environ={}, use_flags=False).cross_group == "elastic"
    default = config_lib.resolve({}, environ={}, use_flags=False)
    assert elastic_alpha(default, 2) == pytest.approx(0.9 / 2) and elastic_alpha(default, 4) == pytest.approx(0.9 / 4)
    assert elastic_alpha(config_lib.resolve({"elastic_alpha": 0.25}, environ={}, use_flags=False), 4) == 0.25
    for environ, groups, words in [({"TFSYNC_ELASTIC_ALPHA": "0.3"}, 4, ["environment: TFSYNC_ELASTIC_ALPHA",
                                                                         "0.3 times 4 groups is above 1", "(0, 0.25]"]),
                                   ({"TFSYNC_ELASTIC_ALPHA": "0.6"}, 2, ["TFSYNC_ELASTIC_ALPHA", "(0, 0.5]"])]:
        with pytest.raises(ConfigError) as raised:
            elastic_alpha(config_lib.resolve(environ=environ, use_flags=False), groups)
        for word in words:
            assert word in str(raised.value)


def errors_of(result):
    return [line for line in (result.stdout + result.stderr).splitlines() if "tfsyncmodes: error:" in line]


@pytest.mark.timeout(120)
def test_hybrid_without_horovodrun_is_one_clear_error():
    result = localrun.run([PYTHON, os.path.join(REPO, "scripts", "train.py"), "--sync_mode=hybrid", "--epochs=1"],
                          timeout=90, env=clean_env(), cwd=REPO)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(errors_of(result)) == 1 and "not started by horovodrun" in errors_of(result)[0]


@pytest.mark.slow  # horovodrun -np 4
@pytest.mark.timeout(120)
def test_group_size_that_does_not_divide_the_world_is_one_clear_error_per_rank():
    command = localrun.horovodrun_command(4, [PYTHON, os.path.join(REPO, "scripts", "train.py"),
                                              "--sync_mode=hybrid", "--sync_group_size=3", "--epochs=1"])
    result = localrun.run(command, timeout=100, env=clean_env(), cwd=REPO)
    assert result.returncode != 0
    assert ">:Traceback" not in result.stdout + result.stderr  # no rank (horovodrun itself may)
    # horovodrun stops the other ranks as soon as one exits, so some may not get to report.
    errors = errors_of(result)
    ranks = [line.split("]")[0] for line in errors]
    assert 1 <= len(errors) <= 4 and len(set(ranks)) == len(ranks), (result.stdout + result.stderr)[-3000:]
    assert all("flag: --sync_group_size: 3 does not divide the world size 4" in line for line in errors)


# --- horovodrun -np 4 against NumPy ----------------------------------------------------------

def speed_plan(step_times, left, epoch, period):
    """The next round's inner steps per group by the rule local_steps.py documents
    (reference.speed_shares, written on its own). Then no more than the steps a group has left in the epoch (at least 1), or, once a
    group has none left (the epoch is over), than the next epoch's steps; H for every group
    while the epoch's steps or the times are unknown."""
    speed = [period] * len(step_times) if min(step_times) <= 0 else reference.speed_shares(step_times, period)
    if any(n < 0 for n in left):
        return [period] * len(step_times)
    bound = [epoch] * len(left) if any(n <= 0 for n in left) else list(left)
    return [min(s, max(b, 1)) for s, b in zip(speed, bound)]


def test_the_plan_picks_the_round_of_most_steps_a_second_by_the_documented_rule():
    """local_steps.plan_steps against speed_plan above: hand-worked cases, then 300 random
    groups of step times. A share of 2.45 steps runs 2 (rounded up, the fast group would wait
    0.55 of a slow step a round: 10 steps in 8 fast ones against 11 in 9.8); 2.86 runs 3;
    equal groups a little apart run H each."""
    import tensorflow as tf
    from tfsyncmodes.exchange.local_steps import plan_steps

    def plan(times, period):
        return [int(n) for n in plan_steps(tf.constant(times, tf.float64), period).numpy()]

    assert plan([0.0663, 0.2163], 8) == [8, 2]
    assert plan([0.1, 0.28], 8) == [8, 3]
    assert plan([1.0, 1.01], 8) == [8, 8]
    assert plan([0.325, 0.5], 4) == [4, 3]  # at H = 4 one more slow step pays: 7 in 1.5 s, not 6 in 1.3
    assert plan([0.2, 0.1, 0.7], 8) == [4, 8, 1]
    rng = np.random.default_rng(7)
    for _ in range(300):
        times = list(rng.uniform(0.01, 1.0, size=rng.integers(1, 6)))
        period = int(rng.integers(1, 17))
        assert plan(times, period) == speed_plan(times, [10 ** 6] * len(times), 10 ** 6, period), (times, period)


def sleeps_of(knobs):
    """{rank: seconds} the worker sleeps after every step in this scenario."""
    sleeps = {int(r): float(t) for r, t in knobs.get("sleep_after_step", {}).items()}
    if knobs.get("slow_worker"):
        index, factor = knobs["slow_worker"].split(":")
        sleeps[int(index)] = float(factor) / 4.0
    return sleeps


def check_speed_rule(workers, knobs, rounds, steps):
    """Every round's steps from the step times the run recorded at the round before, by the
    documented rule (the first round: min(H, the epoch's steps) for every group); the times
    are the same on every rank, and each group's is at least its slowest rank's sleep."""
    period = knobs["period"]
    times, left, epoch = workers[0]["round_times"], workers[0]["round_left"], workers[0]["round_epoch"]
    for w in workers:  # allgathered: every rank planned from the same figures
        np.testing.assert_array_equal(w["round_times"], times)
        np.testing.assert_array_equal(w["round_left"], left)
    assert times.shape == rounds.shape and list(epoch) == [steps] * len(rounds), (times, epoch)
    sleeps = sleeps_of(knobs)
    for g, ranks in enumerate(workers[0]["groups"]):
        assert (times[:, g] >= 0.9 * max(sleeps.get(int(r), 0.0) for r in ranks)).all(), times
    assert list(rounds[0]) == [min(period, steps)] * rounds.shape[1], rounds
    for r in range(1, len(rounds)):
        want = speed_plan([float(t) for t in times[r - 1]], [int(n) for n in left[r - 1]], int(epoch[r - 1]), period)
        assert list(rounds[r]) == want, (r, rounds, times, left)


def check_local_steps(workers, knobs, steps, tolerance):
    """The recorded rounds: the same on every rank, unequal (the slowed group runs fewer inner
    steps), planned from the recorded step times by the documented rule, each group's steps in
    the epoch, and the weights against NumPy's replay of them."""
    groups = [list(g) for g in workers[0]["groups"]]
    rounds = workers[0]["round_steps"]
    for w in workers:
        np.testing.assert_array_equal(w["round_steps"], rounds)
    sleeps = sleeps_of(knobs)
    slowest = max(sleeps, key=sleeps.get)
    slow = [g for g, ranks in enumerate(groups) if slowest in ranks][0]
    check_speed_rule(workers, knobs, rounds, steps)
    assert rounds.shape[1] == 2 and rounds.min() >= 1, rounds
    assert rounds[:, 1 - slow].sum() == steps, rounds  # the fast group ran the whole epoch
    assert any(r[slow] < r[1 - slow] for r in rounds), rounds  # ... and more steps per round
    assert rounds.max() <= knobs["period"]
    for w in workers:  # every rank ran its group's steps, no more
        assert int(w["iterations"]) == rounds[:, int(w["group"])].sum()
        logged = json.loads(str(w["local_steps"]))
        assert logged["local_steps_rounds"] == len(rounds)
        for g in range(2):
            assert logged[f"local_steps_group{g}"] == pytest.approx(rounds[:, g].mean())
    x, y = reference.linear_data(steps, 4)
    options = {k: v for k, v in knobs.items()
               if k in ("compression", "topk_ratio", "error_feedback", "outer_optimizer", "outer_lr", "outer_momentum",
                        "period")}
    want, used = reference.local_steps_training(workers[0]["kernel0"], workers[0]["bias0"], x, y, groups,
                                                rounds, **options)
    assert used == [int(rounds[:, g].sum()) for g in range(2)]
    for w in workers:
        np.testing.assert_allclose(w["kernel"], want[int(w["group"])][0], rtol=0, atol=tolerance)
        np.testing.assert_allclose(w["bias"], want[int(w["group"])][1], rtol=0, atol=tolerance)
        np.testing.assert_array_equal(w["kernel"], workers[0]["kernel"])
    # Weighting matters: the plain mean of the groups' changes over the same rounds is another model.
    unweighted, _ = reference.local_steps_training(workers[0]["kernel0"], workers[0]["bias0"], x, y, groups,
                                                   rounds, weighted=False, **options)
    assert np.abs(unweighted[0][0] - want[0][0]).max() > 1e-4


@pytest.mark.slow
@pytest.mark.timeout(600)
@KERAS3_SHARED
def test_local_steps_auto_plans_each_round_by_the_speed_rule(tmp_path_factory):
    """Two groups whose slowest ranks sleep 0.325 s and 0.5 s a step, 8 steps, H = 4: every
    round's steps follow the documented plan (speed_plan) of the step times the run recorded (and
    clipped as documented), the slower group running a share that is neither 1 nor H; the
    weights equal NumPy's replay of those rounds."""
    steps = AUTO_PARTIAL["auto_partial"]["steps"]
    assert steps == 8
    workers = keras3_job(tmp_path_factory)["auto_partial"]  # one scenario of the shared Keras 3 job
    check_local_steps(workers, AUTO_PARTIAL["auto_partial"], steps, tolerance=1e-6)
    rounds = workers[0]["round_steps"]
    assert any(1 < r[1] < 4 for r in rounds), rounds  # the rule made a share between the bounds


def rounds_schedule(workers, knobs, steps):
    """Each group's count of background rounds applied after each step, as the run recorded
    it (None: the exchange ran in the step), checked against the staleness bound."""
    staleness, warmup = knobs.get("staleness", 0), knobs.get("warmup_steps", 0)
    if knobs.get("cross_group", "periodic") != "stale" or staleness == 0:
        return None
    groups = [list(g) for g in workers[0]["groups"]]
    schedule = []
    for ranks in groups:
        counts = [list(workers[r]["schedule"]) for r in ranks]
        assert all(c == counts[0] for c in counts), counts  # the ranks of a group agree
        assert len(counts[0]) == steps and not any(counts[0][:warmup])  # warm-up: in the step
        counts = counts[0][warmup:]
        for done, applied in enumerate(counts):
            sent = done + 1  # rounds handed over once this step is done
            assert sent - staleness <= applied <= sent, (counts, staleness)
            assert done == 0 or applied >= counts[done - 1]
        schedule.append(counts)
    # History's cross_group_lag: each rank's mean over the epoch's steps of the rounds sent but
    # not applied, averaged over the ranks (equal groups: over the groups) like every epoch log.
    lags = [sum(done + 1 - applied for done, applied in enumerate(counts)) / steps for counts in schedule]
    assert all(float(w["lag"]) == pytest.approx(sum(lags) / len(lags)) for w in workers)
    return schedule


def numpy_knobs(knobs):
    """The knobs the fixed-schedule reference takes (local_steps fixed: every `period` steps;
    the scenarios pin the period and the fixed schedule, whatever hybrid's defaults); a
    quantizing compression as its replay (per tensor: the kernel's entries, then the bias's)."""
    assert knobs.get("local_steps") == "fixed" or knobs.get("cross_group") != "periodic", knobs
    picked = {k: v for k, v in knobs.items() if k not in ("groups", "local_steps", "compression_per_tensor")}
    name, ratio = knobs.get("compression", "none"), knobs.get("topk_ratio", 0.01)
    if knobs.get("compression_per_tensor"):
        sizes = [reference.FEATURES * reference.OUTPUTS, reference.OUTPUTS]
        picked["roundtrip"] = lambda flat: ref.per_tensor_roundtrip(flat, sizes, name, ratio)[0]
    elif "int" in name:
        picked["roundtrip"] = lambda flat: ref.quantized_roundtrip(flat, name, ratio)[0]
    return picked


def check_against_numpy(workers, knobs, steps, tolerance):
    groups = [list(g) for g in workers[0]["groups"]]
    x, y = reference.linear_data(steps, 4)
    want = reference.hybrid_training(workers[0]["kernel0"], workers[0]["bias0"], x, y, groups,
                                     schedule=rounds_schedule(workers, knobs, steps), **numpy_knobs(knobs))
    for w in workers:
        assert int(w["iterations"]) == steps
        np.testing.assert_allclose(w["kernel"], want[int(w["group"])][0], rtol=0, atol=tolerance)
        np.testing.assert_allclose(w["bias"], want[int(w["group"])][1], rtol=0, atol=tolerance)
        # Training ends with one model (the final average): every rank holds the same bits.
        for peer in workers:
            np.testing.assert_array_equal(w["kernel"], peer["kernel"])
    return want


@pytest.mark.slow
@pytest.mark.timeout(600)
@KERAS3_SHARED
def test_hybrid_keras3_two_groups_of_two_equal_numpy(tmp_path_factory):
    steps = 4
    results = keras3_job(tmp_path_factory)
    for name, knobs in AUTO_STEPS.items():
        check_local_steps(results[name], knobs, steps, tolerance=1e-6)
    check_against_numpy(results["periodic_period_3"], FIXED_STEPS["periodic_period_3"], steps, tolerance=1e-6)
    size = reference.FEATURES * reference.OUTPUTS + reference.OUTPUTS
    for name, knobs in KERAS3.items():
        workers = results[name]
        assert str(workers[0]["optimizer_class"]) == "SyncOptimizer"
        assert [list(g) for g in workers[0]["groups"]] == [[0, 1], [2, 3]]
        check_against_numpy(workers, knobs, steps, tolerance=1e-6)
        if name != "plain":  # groups drift apart (before the final mean; between averages)
            x, y = reference.linear_data(steps, 4)
            if knobs["cross_group"] != "stale":  # stop after an update that no average follows
                period, n = knobs["period"], steps
                while n % period == 0 or n <= knobs.get("warmup_steps", 0):
                    n -= 1
                x, y = x[:n], y[:n]
            apart = reference.hybrid_training(workers[0]["kernel0"], workers[0]["bias0"], x, y,
                                              [[0, 1], [2, 3]], consensus=False,
                                              schedule=rounds_schedule(workers, knobs, steps), **numpy_knobs(knobs))
            assert np.abs(apart[0][0] - apart[1][0]).max() > 1e-4
        assert all(int(w["dense_bytes"]) == 4 * size for w in workers)
    # Top-K 1.0, no compression, staleness 0 is sync mode: the mean gradient over all ranks.
    plain = results["plain"][0]
    x, y = reference.linear_data(steps, 4)
    kernel, bias = reference.mean_gradient_training(plain["kernel0"], plain["bias0"], x, y, "sgd")
    np.testing.assert_allclose(plain["kernel"], kernel, rtol=0, atol=1e-6)
    np.testing.assert_allclose(plain["bias"], bias, rtol=0, atol=1e-6)
    assert np.abs(plain["kernel0"] - results["plain"][2]["kernel0"]).max() > 1e-3  # broadcast mattered
    # Bytes in the history come from what each rank sends across groups: a dense payload
    # (float32, fp16) goes in slices, rank j of a group the j-th of 2 (rank 0: the first
    # size // 2 entries, rank 1 the rest); Top-K's k values + k indices go whole.
    k = int(np.ceil(0.25 * size))
    for rank, entries in ((0, size // 2), (1, size - size // 2)):
        expected = {"plain": (4 * entries, None), "topk": (8 * k, 8 * k / (4 * size)),
                    "stale_fp16": (2 * entries, None), "periodic_topk": (8 * k * (steps // 2) / steps, None)}
        for name, (sent, ratio) in expected.items():
            w = results[name][rank]
            assert float(w["bytes_sent"]) == pytest.approx(sent), (name, rank)
            assert float(w["compression_ratio"]) == pytest.approx(ratio or sent / (4 * size))
    # The quantizing payloads go whole from every rank: int8's codes and one (lo, scale) a round
    # (2 rounds in 4 steps); per tensor each tensor's codes, scale, packed indices a step.
    ones = np.ones(size, np.float32)
    per_tensor = ref.per_tensor_roundtrip(ones, [size - reference.OUTPUTS, reference.OUTPUTS], "topk_int4", 0.25)[1]
    for name, want in (("periodic_int8", (size + 8) * 2 / steps), ("stale_topk_int4_per_tensor", per_tensor)):
        assert [float(w["bytes_sent"]) for w in results[name]] == pytest.approx([want] * 4), name
    check_as_periodic_and_elastic(results, "periodic_topk", steps)


def check_as_periodic_and_elastic(results, periodic, steps):
    """The special cases equal plain periodic averaging bit for bit; elastic differs from it,
    and its final model is the center, not the groups' mean."""
    for name in AS_PERIODIC:
        for w, p in zip(results[name], results[periodic]):
            np.testing.assert_array_equal(w["kernel"], p["kernel"])
            np.testing.assert_array_equal(w["bias"], p["bias"])
    assert np.abs(results["elastic_none"][0]["kernel"] - results[periodic][0]["kernel"]).max() > 1e-4
    for name in ELASTIC:  # the center is optimizer state (saved, broadcast) and the final model
        for w in results[name]:
            np.testing.assert_array_equal(w["center"], np.concatenate([w["kernel"].ravel(), w["bias"].ravel()]))
    # Elastic's Top-K payloads travel only at its rounds (steps 1, warm-up, and 3 of 4): k values + k indices.
    k = int(np.ceil(0.25 * (reference.FEATURES * reference.OUTPUTS + reference.OUTPUTS)))
    assert float(results["elastic_topk"][0]["bytes_sent"]) == pytest.approx(8 * k * 2 / steps)
    w = results["elastic_topk"][0]
    x, y = reference.linear_data(steps, 4)
    groups = [list(g) for g in w["groups"]]
    apart = reference.hybrid_training(w["kernel0"], w["bias0"], x, y, groups, consensus=False, **ELASTIC["elastic_topk"])
    assert np.abs(np.mean([a[0] for a in apart], axis=0) - w["kernel"]).max() > 1e-4


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_hybrid_tf_keras_explicit_groups_stale_topk_and_outer_nesterov_equal_numpy(tmp_path):
    knobs = {"compression": "topk", "topk_ratio": 0.2, "staleness": 1, "cross_group": "stale",
             "staleness_aware_lr": False}  # late rounds count in full (Keras 3 covers the discount)
    nesterov = {"compression": "topk", "topk_ratio": 0.25, "period": 2, "cross_group": "periodic",
                "outer_optimizer": "nesterov", "outer_lr": 0.5, "outer_momentum": 0.8, "local_steps": "fixed"}
    auto = dict(nesterov, local_steps="auto", slow_worker="1:4.0")
    # Also under tf_keras: plain periodic and its two special cases, elastic averaging, and
    # --sync_local_steps=auto with unequal groups.
    scenarios = {"stale_topk": knobs, "periodic_nesterov": nesterov, "periodic_topk": SCENARIOS["periodic_topk"],
                 **AS_PERIODIC, **ELASTIC}
    results = run_scenarios(tmp_path, dict(scenarios, auto_nesterov=auto), steps=4, TFSYNC_GROUPS="0,2;1,3",
                            TF_USE_LEGACY_KERAS=1)
    check_local_steps(results["auto_nesterov"], auto, steps=4, tolerance=1e-6)
    for name, scenario in scenarios.items():
        workers = results[name]
        assert str(workers[0]["optimizer_class"]) == "SyncSGD"
        assert [list(g) for g in workers[0]["groups"]] == [[0, 2], [1, 3]]
        check_against_numpy(workers, scenario, steps=4, tolerance=1e-6)
    check_as_periodic_and_elastic(results, "periodic_topk", steps=4)
