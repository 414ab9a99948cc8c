"""The example trainer's emulated compute (tfsyncmodes/examples/emulated_compute.py): the
per-step delays --compute_jitter draws, against NumPy's own generators; the transient window of
--compute_slow_worker; and the waits the input pipeline really makes."""
import time

import numpy as np
import pytest
import tensorflow as tf
from absl import flags
from absl.testing import flagsaver

from tfsyncmodes.examples import emulated_compute

STEPS = 20000


def ks_statistic(a, b) -> float:
    """Two-sample Kolmogorov-Smirnov statistic, written with NumPy."""
    grid = np.sort(np.concatenate([a, b]))
    cdf_a = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.max(np.abs(cdf_a - cdf_b)))


def ks_limit(n: int, m: int) -> float:
    """The two-sample KS critical value at the 0.1 % level (c(alpha) = 1.95)."""
    return 1.95 * np.sqrt((n + m) / (n * m))


@pytest.fixture(autouse=True, scope="module")
def parsed_flags():
    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["test"])


@pytest.mark.parametrize("spec, reference", [
    ("lognormal:0.5", lambda rng, n: rng.lognormal(mean=-0.5 ** 2 / 2, sigma=0.5, size=n)),
    ("lognormal:1.2", lambda rng, n: rng.lognormal(mean=-1.2 ** 2 / 2, sigma=1.2, size=n)),
    # NumPy's pareto is the Lomax form: 1 + it is the classic Pareto with x_m = 1.
    ("pareto:2", lambda rng, n: (2 - 1) / 2 * (1 + rng.pareto(2.0, size=n))),
    ("pareto:1.5", lambda rng, n: (1.5 - 1) / 1.5 * (1 + rng.pareto(1.5, size=n))),
])
def test_jitter_draws_the_named_distribution(spec, reference):
    drawn = emulated_compute.jitter_factors(spec, seed=7, worker=1, steps=STEPS)
    expected = reference(np.random.default_rng(0), 4 * STEPS)
    assert drawn.shape == (STEPS,) and np.all(drawn > 0)
    assert ks_statistic(drawn, expected) < ks_limit(STEPS, 4 * STEPS), spec
    # Mean 1 (the median is robust for the heavy tails): the jitter moves no compute on average.
    assert abs(np.median(drawn) - np.median(expected)) < 0.03 * np.median(expected)
    if spec.startswith("lognormal"):
        assert abs(drawn.mean() - 1.0) < 4 * drawn.std() / np.sqrt(STEPS)
    else:
        assert drawn.min() >= (float(spec.split(":")[1]) - 1) / float(spec.split(":")[1]) - 1e-12


def test_jitter_is_seeded_by_seed_worker_and_step():
    a = emulated_compute.jitter_factors("pareto:2", seed=3, worker=0, steps=500)
    assert np.array_equal(a, emulated_compute.jitter_factors("pareto:2", seed=3, worker=0, steps=500))
    other_worker = emulated_compute.jitter_factors("pareto:2", seed=3, worker=1, steps=500)
    other_seed = emulated_compute.jitter_factors("pareto:2", seed=4, worker=0, steps=500)
    for other in (other_worker, other_seed):
        assert np.mean(a == other) < 0.01
        assert ks_statistic(a, other) < ks_limit(500, 500)  # the same distribution all the same


def test_transient_slow_window_covers_its_steps_on_its_worker_only():
    slow = emulated_compute.parse_slow("1:4:3:6")
    factors = {w: [float(f) for f in emulated_compute.factors_dataset(slow, None, 0, w).take(8)] for w in (0, 1)}
    assert factors[0] == [1.0] * 8
    assert factors[1] == [1, 1, 1, 4, 4, 4, 1, 1]
    persistent = emulated_compute.parse_slow("2:3")
    assert [float(f) for f in emulated_compute.factors_dataset(persistent, None, 0, 2).take(3)] == [3.0] * 3


def test_a_transient_window_in_seconds_follows_the_clock():
    """A window of 0.25 s to 0.85 s after the first step, read about every 0.1 s for 1.1 s: the
    factor is 4 on worker 1 wherever the time since its first read (stamped before and after
    each read, so a loaded machine's delays only widen the bounds) is surely inside the window,
    1 wherever it is surely outside, and 1 on worker 0 throughout."""
    slow = emulated_compute.parse_slow("1:4:0.25s:0.85s")
    assert slow[2:] == (0.25, 0.85, True)
    # Read as the trainer reads them: one at a time (tf.data would otherwise read one ahead).
    iterators = {w: iter(emulated_compute._in_step(emulated_compute.factors_dataset(slow, None, 0, w)))
                 for w in (0, 1)}
    reads, others = [], []  # worker 1's (before, after, factor); worker 0's factors
    while not reads or reads[-1][1] - reads[0][0] < 1.1:
        others.append(float(next(iterators[0])))
        before = time.time()
        factor = float(next(iterators[1]))
        reads.append((before, time.time(), factor))
        time.sleep(0.1)
    first_before, first_after = reads[0][:2]  # the window's clock starts within the first read
    inside, outside = [], []
    for before, after, factor in reads:
        earliest, latest = before - first_after, after - first_before
        if earliest >= 0.25 and latest < 0.85:
            inside.append(factor)
        elif latest < 0.25 or earliest >= 0.85:
            outside.append((earliest >= 0.85, factor))
        else:
            assert factor in (1.0, 4.0), reads
    assert inside and set(inside) == {4.0}, reads
    assert {late for late, _ in outside} == {False, True} and {f for _, f in outside} == {1.0}, reads
    assert set(others) == {1.0}


@pytest.mark.parametrize("spec", ["weibull:1", "pareto:1", "pareto:x", "lognormal:0", "lognormal:nan", "pareto"])
def test_bad_jitter_is_one_line_naming_the_flag(spec):
    with pytest.raises(emulated_compute.ConfigError) as raised:
        emulated_compute.parse_jitter(spec)
    assert str(raised.value).startswith("flag: --compute_jitter: ") and "\n" not in str(raised.value)


@pytest.mark.parametrize("spec", ["1", "1:0.5", "-1:2", "1:4:5:5", "1:4:5", "1:4:-1:3", "1:inf", "1:4:5s:5s",
                                  "1:4:5s:9", "1:4:1s:infs"])
def test_bad_slow_worker_is_one_line_naming_the_flag(spec):
    with pytest.raises(emulated_compute.ConfigError) as raised:
        emulated_compute.parse_slow(spec)
    assert str(raised.value).startswith("flag: --compute_slow_worker: ")


def test_the_pipeline_waits_each_drawn_delay():
    steps, compute_ms, batch = 12, 100.0, 8
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    with flagsaver.flagsaver(compute_ms=compute_ms, compute_jitter="pareto:1.5", compute_slow_worker="1:3:4:8"):
        data = tf.data.Dataset.range(1000).batch(batch // 2)
        waited = iter(emulated_compute.step_waits(data, context, False, batch, seed=5).take(steps))
        got = [int(next(waited)[0])]  # the first element outside the clock: the pipeline built and traced
        started = time.perf_counter()
        got += [int(element[0]) for element in waited]
        elapsed = time.perf_counter() - started
    assert got == [4 * i for i in range(steps)]  # the data go through unchanged
    factors = emulated_compute.jitter_factors("pareto:1.5", seed=5, worker=1, steps=steps).copy()
    factors[4:8] *= 3
    expected = float(np.sum(factors[1:])) * compute_ms / 2 / 1000  # this worker's half of the batch
    # Each step waits its delay once: a pipeline that waited twice (or not at all) is out of
    # bounds (twice would take 2x; the upper bound leaves a loaded machine 0.6x).
    assert expected * 0.95 < elapsed < expected * 1.6, (elapsed, expected)


def _ancestors(op) -> set:
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent.name not in seen:
                seen.add(parent.name)
                todo.append(parent)
    return seen


@pytest.mark.parametrize("ordered", [True, False])
def test_the_emulated_models_variables_are_read_after_its_batch(ordered):
    """The trainer's MLP under --compute_ms reads its variables once the batch (whose GetNext
    holds the emulated wait) is in, as a real forward pass needs its variables before it
    computes: in async mode those reads are the pulls from the parameter servers. A plain
    Sequential reads them beside the batch (the second case says the graph check can tell)."""
    from tfsyncmodes.keras.compat import keras

    layers = [keras.Input((4,)), keras.layers.Dense(3, activation="relu"), keras.layers.Dense(2)]
    model = emulated_compute.ReadsAfterBatch(layers) if ordered else keras.Sequential(layers)
    iterator = iter(tf.data.Dataset.from_tensors(tf.ones([2, 4])).repeat())

    @tf.function
    def forward(iterator):
        return model(next(iterator), training=True)

    graph = forward.get_concrete_function(iterator).graph
    batch = [op.name for op in graph.get_operations() if op.type.startswith("IteratorGetNext")]
    reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp"]
    assert len(batch) == 1 and len(reads) == 4  # two kernels, two biases
    after = [batch[0] in _ancestors(read) for read in reads]
    assert after == [ordered] * 4


def test_the_emulated_model_saves_and_loads(tmp_path):
    from tfsyncmodes.keras.compat import keras

    model = emulated_compute.ReadsAfterBatch([keras.Input((4,)), keras.layers.Dense(2)])
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert type(loaded) is emulated_compute.ReadsAfterBatch
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(model(x)))
