"""The ranks of ``python -m benchmarks.bench_hybrid``: each measures (a)-(d) (see there) in one
``horovodrun`` job and rank 0 writes every rank's numbers to ``--worker_out``."""
from __future__ import annotations

import json
import statistics
import time

from benchmarks.hybrid_flags import FLAGS

EVAL_EVERY = 5  # (c): steps between two evaluations of the loss


def measure_compression(hvd, size: int, local_model, xb, yb) -> dict:
    """(b): Top-K compress + decompress of a `size`-entry update, per implementation, with and
    without error feedback, and each stage of the selection timed alone, all on rank 0 while
    the other ranks wait, interleaved with a dense training step (`local_model`, no exchange)
    in `b_repeats` rounds; then every rank compressing at once. Returns seconds per call."""
    import numpy as np
    import tensorflow as tf

    from tfsyncmodes.exchange.compressors import TopK
    from tfsyncmodes.exchange.flat import TensorContext
    from tfsyncmodes.exchange.memory import ErrorFeedback
    from tfsyncmodes.exchange.topk import CANDIDATE_MARGIN, load_native

    flat = tf.constant(np.random.default_rng(2).standard_normal(size).astype("float32"))
    ctx = TensorContext("flat", (size,))
    implementations = ["native", "ops"] if load_native() is not None else ["ops"]
    calls = {}
    for implementation in implementations:
        compressor = TopK(ratio=FLAGS.topk_ratio, implementation=implementation)
        memory = ErrorFeedback()
        memory.build(ctx, lambda name, shape, dtype: tf.Variable(tf.zeros(shape, dtype), trainable=False))

        def compress_decompress(update, compressor=compressor):
            return compressor.decompress(compressor.compress(update, ctx), ctx)

        def with_error_feedback(update, compressor=compressor, memory=memory):
            compensated = memory.compensate(update, ctx)
            payload = compressor.compress(compensated, ctx)
            remembered = memory.update(compensated, payload, compressor, ctx)
            with tf.control_dependencies([remembered]):
                return compressor.decompress(payload, ctx)

        calls[f"{implementation}.compress_decompress"] = (tf.function(compress_decompress), (flat,))
        calls[f"{implementation}.with_error_feedback"] = (tf.function(with_error_feedback), (flat,))
    # Where the time goes: each stage alone, on the inputs it sees in a real call.
    k = TopK(ratio=FLAGS.topk_ratio, implementation="ops").k(size)
    magnitudes = np.sort(np.abs(flat.numpy()))
    threshold = tf.constant(magnitudes[-int(CANDIDATE_MARGIN * k)])
    mask = tf.abs(flat) >= threshold
    candidates = tf.cast(tf.where(mask)[:, 0], tf.int32)
    indices = tf.math.top_k(tf.abs(flat), k).indices
    values = tf.gather(flat, indices)
    stages = {
        "call": (lambda v: v[:1], (flat,)),
        "abs_compare": (lambda v, t: tf.abs(v) >= t, (flat, threshold)),
        "where": (lambda m: tf.where(m), (mask,)),
        "sample_top_k": (lambda v: tf.math.top_k(tf.abs(v[::size // 20000]),
                                                 int(CANDIDATE_MARGIN * k * 20000 / size) + 1, sorted=False).values,
                         (flat,)),
        "candidates_top_k": (lambda v, c: tf.math.top_k(tf.abs(tf.gather(v, c)), k, sorted=False).indices,
                             (flat, candidates)),
        "gather_values": (lambda v, i: tf.gather(v, i), (flat, indices)),
        "segment_sum": (lambda v, i: tf.math.unsorted_segment_sum(v, i, size), (values, indices)),
        "scatter_nd": (lambda v, i: tf.scatter_nd(i[:, None], v, [size]), (values, indices)),
        "chunked_top_k": (lambda v: tf.math.top_k(tf.reshape(tf.abs(v[:size // 4096 * 4096]), [-1, 4096]),
                                                  -(-k // (size // 4096)), sorted=False).indices, (flat,)),
    }
    native = load_native()
    if native is not None:
        stages["native_select"] = (lambda v: native.tfsync_top_k_magnitude(v, k=k), (flat,))
        stages["native_scatter"] = (lambda v, i: native.tfsync_scatter_dense(v, i, size=size), (values, indices))
    calls.update({f"stage.{name}": (tf.function(function), args) for name, (function, args) in stages.items()})
    calls["local_step"] = (local_model.train_on_batch, (xb, yb))

    def timed(function, args):
        started = time.perf_counter()
        out = function(*args)
        np.asarray(out[0] if isinstance(out, (tuple, list)) else out)
        return time.perf_counter() - started

    for function, args in calls.values():
        function(*args)
        function(*args)
    results = {"implementations": implementations, "topk_k": k}
    rounds = []
    if hvd.rank() == 0:  # rank 0 alone, the others wait: cost against compute on equal cores
        for _ in range(FLAGS.b_repeats):
            rounds.append({name: statistics.median(timed(*calls[name]) for _ in range(15)) for name in calls})
    results["alone_rounds"] = rounds
    hvd.allreduce(tf.constant(0.0), name="bench.barrier.alone")
    crowd = []
    for repeat in range(FLAGS.b_repeats):  # all ranks at once, as in a training step
        one = {}
        for name in [n for n in calls if n.endswith(("compress_decompress", "with_error_feedback"))]:
            hvd.allreduce(tf.constant(0.0), name=f"bench.barrier.{name}.{repeat}")
            one[name] = statistics.median(timed(*calls[name]) for _ in range(10))
        crowd.append(one)
    results["crowd_rounds"] = crowd
    return results


def worker(out_path: str) -> None:
    import numpy as np
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes import config as config_lib
    from tfsyncmodes.exchange.policies import CrossGroupPolicy
    from tfsyncmodes import faults
    from tfsyncmodes.keras.compat import keras

    base = {"mode": "hybrid", "group_size": 2, "slow_worker": "1:4.0"}
    configs = json.loads(FLAGS.configs)
    names = list(configs)
    # (a) counts the bytes of an exchange every step (cross_group=stale), as measured so far.
    a_knobs = dict(base, compression=FLAGS.compression, topk_ratio=FLAGS.topk_ratio, cross_group="stale",
                   staleness=400)
    strategy = tfsyncmodes.make_strategy(config=config_lib.resolve(base, environ={}, use_flags=False))
    hvd = strategy.hvd
    rank = hvd.rank()
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((FLAGS.features, 10)).astype("float32")
    x_eval = rng.standard_normal((512, FLAGS.features)).astype("float32")
    y_eval = np.argmax(x_eval @ teacher, axis=1).astype("int32")
    x = np.random.default_rng(1 + rank).standard_normal((FLAGS.batch_size * 64, FLAGS.features)).astype("float32")
    y = np.argmax(x @ teacher, axis=1).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(FLAGS.batch_size, drop_remainder=True)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def new_model(mode):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((FLAGS.features,)),
            keras.layers.Dense(FLAGS.hidden, activation="relu"),
            keras.layers.Dense(FLAGS.hidden, activation="relu"),
            keras.layers.Dense(10)])
        # Each model's exchange is built from the config it is wrapped with.
        knobs = {"mode": "sync"} if mode == "sync" else (
            a_knobs if mode == "bytes" else dict(base, **configs[mode]))
        knobs = config_lib.resolve(knobs, environ={}, use_flags=False)
        model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.Adam(1e-3), config=knobs), loss=loss_fn,
                      jit_compile=False)
        return model

    class LossClock(keras.callbacks.Callback):
        """Evaluation loss every EVAL_EVERY steps against training time (evaluation excluded)."""

        def on_train_begin(self, logs=None):
            self.points, self.paused, self.began = [], 0.0, time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if (batch + 1) % EVAL_EVERY:
                return
            now = time.perf_counter()
            loss = float(loss_fn(y_eval, self.model(x_eval, training=False)))
            self.points.append((batch + 1, now - self.began - self.paused, loss))
            self.paused += time.perf_counter() - now

    class StepClock(keras.callbacks.Callback):
        """Wall time from the end of the first step to the end of the last (the first may
        still build things)."""

        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                self.began = time.perf_counter()
            self.last = time.perf_counter()

    results = {}
    quiet = strategy.required_callbacks()
    required = quiet + faults.callbacks_for(strategy.config, rank)  # rank 1's SlowWorker

    def new_models():
        models = {mode: new_model(mode) for mode in ["sync"] + names}
        for model in models.values():  # build, trace, broadcast: the same 3 steps for both
            model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0, callbacks=quiet)
        return models

    models = new_models()

    # (a) bytes per step from the payloads, and (b) the cost of compressing.
    first = new_model("bytes")
    first.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0, callbacks=quiet)
    link = first.optimizer.exchange.find(CrossGroupPolicy)[0].link
    history = first.fit(dataset, epochs=1, steps_per_epoch=20, verbose=0, callbacks=quiet)
    results["bytes_sent_per_step"] = history.history["bytes_sent"][-1]
    results["dense_bytes_per_step"] = link.dense_bytes
    results["parameters"] = size = link.dense_bytes // 4
    results["sync_step_s"] = []
    for _ in range(3):
        hvd.allreduce(tf.constant(0.0), name="bench.barrier")
        started = time.perf_counter()
        models["sync"].fit(dataset, epochs=1, steps_per_epoch=20, verbose=0, callbacks=quiet)
        results["sync_step_s"].append((time.perf_counter() - started) / 20)
    # (b) the cost of compressing, on rank 0 alone against a dense step, and on all ranks.
    local = keras.models.clone_model(models["sync"])
    local.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss_fn, jit_compile=False)
    results.update(measure_compression(hvd, size, local, x[:FLAGS.batch_size], y[:FLAGS.batch_size]))
    if FLAGS.only_b:
        everyone = hvd.allgather_object(results)
        if rank == 0:
            with open(out_path, "w", encoding="utf-8") as handle:
                json.dump(everyone, handle)
        return

    # (d) steps per second and (c) time to the target loss with rank 1 slowed 4x, every
    # configuration against the sync run of its own repeat, from fresh models.
    for repeat in range(FLAGS.repeats):
        for mode, model in models.items():
            clock = StepClock()
            hvd.allreduce(tf.constant(0.0), name=f"bench.barrier.speed.{mode}.{repeat}")
            model.fit(dataset, epochs=1, steps_per_epoch=FLAGS.speed_steps, verbose=0,
                      callbacks=required + [clock])
            results.setdefault(f"{mode}_steps_per_s", []).append((FLAGS.speed_steps - 1) / (clock.last - clock.began))
        models = new_models()
        for mode, model in models.items():
            clock = LossClock()
            hvd.allreduce(tf.constant(0.0), name=f"bench.barrier.loss.{mode}.{repeat}")
            steps = FLAGS.steps if mode == "sync" else FLAGS.steps * FLAGS.hybrid_steps_factor
            history = model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=required + [clock])
            results.setdefault(f"{mode}_curve", []).append(clock.points)
            results.setdefault(f"{mode}_local_steps", []).append(
                {k: v[-1] for k, v in history.history.items() if k.startswith("local_steps")})
        if repeat + 1 < FLAGS.repeats:
            models = new_models()
    everyone = hvd.allgather_object(results)
    if rank == 0:
        with open(out_path, "w", encoding="utf-8") as handle:
            json.dump(everyone, handle)
