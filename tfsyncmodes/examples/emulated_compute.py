"""The example trainer's emulated compute: its flags, their checks, and the per-step waits.

    --compute_ms=MS                      a step on --batch_size samples waits MS milliseconds
    --compute_slow_worker=I:F[:FROM:TO]  worker I waits F times as long (only in steps [FROM, TO),
                                         or FROMs:TOs, seconds after its first step)
    --compute_jitter=lognormal:SIGMA     every step's wait times a random factor of mean 1
    --compute_jitter=pareto:ALPHA        (lognormal: mu = -SIGMA^2/2; Pareto: x_m = (ALPHA-1)/ALPHA)

The wait is TensorFlow's own sleep dataset (tf.data's testing transformation: no public API has
it), so a waiting worker holds no core. Step i of worker w waits

    compute_ms * (its part of the batch) * slow(w, i) * jitter(w, i)

where jitter(w, i) is drawn from TensorFlow's stateless random ops seeded with (--seed, w, i):
the same run draws the same delays, and :func:`jitter_factors` gives them without sleeping (its
distribution is checked against NumPy's in tests/test_emulated_compute.py). The step index
counts the batches the worker's input pipeline hands out. A window in seconds (``1:4:20s:40s``)
is read from the clock when a step asks for its wait, from the worker's first step: it covers
the same stretch of time in every mode, where a window of steps lasts longer in a mode that
runs the slow worker's steps at its own pace (hybrid) than in one that waits for it (sync).

The wait is in the batch's ``GetNext``, and nothing else orders a step's reads of the variables
after it: in async mode the forward pass's pulls from the parameter servers could run during
the wait, where a real forward pass needs its variables before it computes. The MLP the trainer
builds under ``--compute_ms`` is therefore a :class:`ReadsAfterBatch`: its variables are read
once the batch (the wait) is in, so an async step is pull, compute, push, in turn, as on real
hardware.

Nor may the wait be read ahead. tf.distribute hands each parameter-server worker its batches
through a ``MultiDeviceIterator``, which fetches the next batch in the background, so the next
step's wait ran during this step's pull and push, and a 2-worker async run on the bed's 10gbit
class ran 40 % faster than pull, compute and push in turn allow (docs/BENCHMARKS.md). Under
``--compute_ms`` the trainer makes async workers' iterators with :func:`input_options`: a
buffer of none, so a worker makes each batch when its step asks for it.
"""
from __future__ import annotations

import math

import tensorflow as tf
from absl import flags
from tensorflow.python.data.experimental.ops import testing

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.keras.compat import keras

flags.DEFINE_float("compute_ms", 0.0,
                   "Emulated compute for benchmarks: a step on --batch_size samples also waits this many "
                   "milliseconds in the input pipeline (a sleep that holds no core), standing for a larger "
                   "model's compute; a worker whose batch is a part of that waits that part of it.")
flags.DEFINE_string("compute_slow_worker", "",
                    "With --compute_ms: 'INDEX:FACTOR' makes worker INDEX wait FACTOR times as long; "
                    "'INDEX:FACTOR:FROM:TO' only in its steps FROM..TO-1 (a transient straggler); "
                    "'INDEX:FACTOR:FROMs:TOs' from FROM to TO seconds after its first step.")
flags.DEFINE_string("compute_jitter", "",
                    "With --compute_ms: every step's wait times a random factor of mean 1, seeded by "
                    "--seed, the worker and the step: 'lognormal:SIGMA' (SIGMA > 0) or 'pareto:ALPHA' "
                    "(ALPHA > 1, heavy-tailed).")

FLAGS = flags.FLAGS
JITTER_KINDS = {"lognormal": (0.0, "SIGMA > 0, e.g. lognormal:0.5"), "pareto": (1.0, "ALPHA > 1, e.g. pareto:2")}


def parse_slow(spec: str):
    """(index, factor, first, end, seconds) of --compute_slow_worker (end None: to the end;
    seconds: the window is in seconds after the worker's first step, not in steps); '' -> None."""
    if not spec:
        return None
    parts = spec.split(":")
    fix = ("use INDEX:FACTOR, INDEX:FACTOR:FROM:TO (steps) or INDEX:FACTOR:FROMs:TOs (seconds) with "
           "INDEX >= 0, FACTOR >= 1, 0 <= FROM < TO, e.g. 1:4:20:60 or 1:4:10s:30s")
    seconds = len(parts) == 4 and parts[2].endswith("s") and parts[3].endswith("s")
    try:
        if len(parts) not in (2, 4):
            raise ValueError
        index, factor = int(parts[0]), float(parts[1])
        window = [part[:-1] if seconds else part for part in parts[2:]]
        kind = float if seconds else int
        first, end = (kind(window[0]), kind(window[1])) if window else (0, None)
        valid = (index >= 0 and math.isfinite(factor) and factor >= 1.0 and 0 <= first
                 and (end is None or (math.isfinite(end) and end > first)))
    except ValueError:
        valid = False
    if not valid:
        raise ConfigError("flag", "--compute_slow_worker", f"{spec!r} is not accepted", fix)
    return index, factor, first, end, seconds


def parse_jitter(spec: str):
    """(kind, parameter) of --compute_jitter; '' -> None."""
    if not spec:
        return None
    kind, _, value = spec.partition(":")
    if kind not in JITTER_KINDS:
        raise ConfigError("flag", "--compute_jitter", f"{spec!r} names no distribution",
                          "use lognormal:SIGMA or pareto:ALPHA, e.g. pareto:2")
    low, fix = JITTER_KINDS[kind]
    try:
        parameter = float(value)
    except ValueError:
        parameter = float("nan")
    if not (math.isfinite(parameter) and parameter > low):
        raise ConfigError("flag", "--compute_jitter", f"{spec!r} is not accepted", f"use {fix}")
    return kind, parameter


def check_flags() -> None:
    """ConfigError for a bad --compute_slow_worker or --compute_jitter."""
    parse_slow(FLAGS.compute_slow_worker)
    parse_jitter(FLAGS.compute_jitter)


def _jitter(kind: str, parameter: float, seed, worker, step):
    """The factor of step `step` of worker `worker` (int64 scalars), mean 1."""
    key = tf.stack([tf.cast(seed, tf.int64), tf.cast(worker, tf.int64) * (1 << 32) + tf.cast(step, tf.int64)])
    if kind == "lognormal":
        normal = tf.random.stateless_normal([], seed=key, dtype=tf.float64)
        return tf.exp(parameter * normal - parameter * parameter / 2.0)
    uniform = tf.random.stateless_uniform([], seed=key, dtype=tf.float64)  # in [0, 1)
    return (parameter - 1.0) / parameter * tf.pow(1.0 - uniform, -1.0 / parameter)


def factors_dataset(slow, jitter, seed: int, worker) -> tf.data.Dataset:
    """Step i's factor slow(worker, i) * jitter(worker, i), for i = 0, 1, ... (float64). A window
    in seconds is placed by the time each factor is asked for, from when the first one was."""
    worker = tf.cast(worker, tf.int64)

    def factor(step, elapsed):
        value = tf.constant(1.0, tf.float64)
        if slow is not None:
            index, slow_factor, first, end, seconds = slow
            at = elapsed if seconds else step
            inside = tf.logical_and(tf.equal(worker, index), at >= first)
            if end is not None:
                inside = tf.logical_and(inside, at < end)
            value *= 1.0 + tf.cast(inside, tf.float64) * (slow_factor - 1.0)
        if jitter is not None:
            value *= _jitter(*jitter, seed, worker, step)
        return value

    def clock(start, step):
        now = tf.timestamp()
        start = tf.where(start < 0.0, now, start)
        return start, factor(step, now - start)

    steps = tf.data.Dataset.counter(dtype=tf.int64)
    if slow is not None and slow[4]:
        return steps.scan(tf.constant(-1.0, tf.float64), clock)
    return steps.map(lambda step: factor(step, tf.constant(0.0, tf.float64)))


def jitter_factors(spec: str, seed: int, worker: int, steps: int):
    """The first `steps` jitter factors --compute_jitter=`spec` draws for `worker` (a NumPy array)."""
    import numpy as np

    dataset = factors_dataset(None, parse_jitter(spec), seed, worker).take(steps).batch(steps)
    return np.asarray(next(iter(dataset)))


def step_waits(dataset: tf.data.Dataset, context, async_mode: bool, batch_size: int, seed: int):
    """`dataset` whose every batch first waits its step's emulated compute."""
    batch = context.get_per_replica_batch_size(batch_size)
    micros = FLAGS.compute_ms * 1000.0 * batch / batch_size
    slow, jitter = parse_slow(FLAGS.compute_slow_worker), parse_jitter(FLAGS.compute_jitter)
    if slow is None and jitter is None:
        return _in_step(dataset.apply(testing.sleep(int(micros))))
    if async_mode:  # every async worker's input context has id 0
        try:
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        except RuntimeError:  # on the chief, which builds a sample batch to build the model
            worker = -1
    else:
        worker = context.input_pipeline_id
    # take(1): the sleep transformation also sleeps before it reports its end, so a one-element
    # sleep dataset read to its end would wait twice per step.
    waits = factors_dataset(slow, jitter, seed, worker).flat_map(
        lambda f: tf.data.Dataset.from_tensors(f).apply(testing.sleep(tf.cast(micros * f, tf.int64))).take(1))
    return _in_step(tf.data.Dataset.zip((dataset, waits)).map(lambda element, _: element))


def _in_step(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` read one batch at a time: tf.data would otherwise append a prefetch after the
    last (synchronous) transformation, and the waits would run ahead of the steps, overlapped
    with the previous step's exchange and hidden from the step times the exchange measures.
    A real step's compute cannot start before the previous update is applied."""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.map_parallelization = False  # a parallel map reads ahead too
    return dataset.with_options(options)


def input_options(async_mode: bool):
    """The ``tf.distribute.InputOptions`` under which an async worker reads its batch (and its
    wait) when its step asks for it: the ``MultiDeviceIterator``'s buffer holds none (a plain
    iterator, ``PER_REPLICA`` without fetching to the device, cannot be passed to the
    coordinator's ``tf.function`` in TensorFlow 2.21). None in the other modes: a Horovod rank
    reads its dataset itself, and :func:`_in_step` already keeps tf.data from reading ahead."""
    if not async_mode:
        return None
    return tf.distribute.InputOptions(experimental_per_replica_buffer_size=0)


@keras.saving.register_keras_serializable(package="tfsyncmodes.examples")
class ReadsAfterBatch(keras.Sequential):
    """A Sequential model whose every op of the forward pass, the variables' reads included,
    waits for its inputs: the emulated compute's wait comes before the parameter servers'
    pulls, not beside them (eager calls, as the chief's evaluation, are unaffected)."""

    def call(self, inputs, training=None, mask=None):
        with tf.control_dependencies(tf.nest.flatten(inputs)):
            return super().call(inputs, training=training, mask=mask)
