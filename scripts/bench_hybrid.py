"""Benchmark: hybrid mode's wire bytes, compression cost, time to a target loss and speed with
a straggler, against sync mode.

    python scripts/bench_hybrid.py [--np=4] [--steps=120] [--speed_steps=40] [--repeats=3] [--only_b]
                                   [--configs='{"name": {knob: value, ...}, ...}']

Starts one ``horovodrun -np N`` job (groups of 2) on an MLP of about 1M parameters. Every
rank measures, interleaved with sync mode on the same model and data:

  (a) bytes on the cross-group wire per step, Top-K 1 % (float32 values + int32 indices),
      from the payloads the exchange really sent, over a dense float32 exchange
      (target <= 0.025);
  (b) Top-K compress (selection + values) + decompress of the whole update, per call and per
      training step (per call / the shipped cross-group period), over a dense training step of
      the same model and batch with no exchange, both timed on rank 0 while the other ranks
      wait, so that both have the same cores (target <= 0.10), in ``--b_repeats`` interleaved
      rounds, for each Top-K implementation (compiled kernels, TensorFlow ops); beside it the
      same with error feedback, all ranks compressing at once against sync mode's step, and
      each stage of the selection alone (where the time goes). ``--only_b`` runs (a) and (b)
      only and updates just (b)'s section and JSON key;
  (c) with rank 1 slowed 4x (``--sync_slow_worker=1:4.0``), the time until the model's loss on a
      fixed evaluation batch first reaches a target, hybrid over sync (target <= 0.6), for
      three targets: the losses sync reaches after 1/4, 1/2 and 3/4 of its `steps`; hybrid runs
      `hybrid_steps_factor` times as many steps, so that its fast group can keep training
      while the slow group is still on its way. Both modes start from the same fresh model;
  (d) with rank 1 slowed 4x, the steps per second of a fast-group rank (ranks 2 and 3) in
      hybrid over the same in sync (target > 1): in sync every rank waits for the straggler
      at every step, in hybrid only its own group does and the fast group waits for the
      slow one only once it is `staleness` rounds ahead.

(c) and (d) run for every hybrid configuration in ``--configs`` (knobs over the shipped
hybrid defaults; "defaults" is the shipped configuration itself), `--repeats` times, sync and
every configuration in turn within a repeat, so that each ratio is taken against the sync run
of its own repeat; the report gives the median and the range over the repeats.
  (e) final test accuracy on digits with no straggler, ``scripts/train.py`` under
      ``horovodrun -np N``: sync against hybrid with `--accuracy_config` (target: within 1
      point), in two more jobs.

Results go to docs/bench_hybrid.json and the ``hybrid`` section of docs/BENCHMARKS.md.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts.quietstart import import_tensorflow_quietly  # noqa: E402

import_tensorflow_quietly()

from absl import app, flags  # noqa: E402

from scripts.benchlib import replace_section, run_ranks  # noqa: E402

flags.DEFINE_integer("np", 4, "Horovod ranks (groups of 2).")
flags.DEFINE_integer("steps", 120, "Steps of each timed straggler run (c).")
flags.DEFINE_integer("speed_steps", 40, "Steps of each timed speed run (d).")
DEFAULT_CONFIGS = {"defaults": {}, "fixed": {"local_steps": "fixed"},
                   "stale_s400": {"cross_group": "stale", "staleness": 400, "compression": "topk"}}
flags.DEFINE_string("configs", json.dumps(DEFAULT_CONFIGS),
                    "JSON: name -> hybrid knobs over the shipped defaults, for (c) and (d).")
flags.DEFINE_integer("repeats", 3, "(c) and (d): rounds of sync + every configuration, in one job.")
flags.DEFINE_string("accuracy_config", "defaults", "(e): the configuration whose digits accuracy is "
                    "compared with sync's ('' : skip (e)).")
flags.DEFINE_integer("accuracy_epochs", 10, "(e): epochs of scripts/train.py on digits.")
flags.DEFINE_integer("hybrid_steps_factor", 3, "(c): hybrid runs this many times sync's steps.")
flags.DEFINE_integer("batch_size", 64, "Per-rank batch size.")
flags.DEFINE_integer("features", 256, "Input features.")
flags.DEFINE_integer("hidden", 896, "Hidden units (two hidden layers): about 1M parameters.")
flags.DEFINE_float("topk_ratio", 0.01, "Top-K ratio.")
flags.DEFINE_enum("compression", "topk", ["none", "fp16", "topk"], "Cross-group compression whose bytes (a) "
                  "counts; (b) always times Top-K.")
flags.DEFINE_boolean("only_b", False, "Run (a) and (b) only and update (b)'s section of BENCHMARKS.md and its key of "
                     "bench_hybrid.json (skips the straggler runs (c) and (d)).")
flags.DEFINE_integer("b_repeats", 5, "(b): rounds of timings, for the spread.")
flags.DEFINE_string("worker_out", None, "Internal: set when running as a rank of the job.")
flags.DEFINE_string("docs_dir", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs"),
                    "Where bench_hybrid.json and BENCHMARKS.md go.")
FLAGS = flags.FLAGS
EVAL_EVERY = 5
LOAD = os.getloadavg()


def measure_compression(hvd, size: int, local_model, xb, yb) -> dict:
    """(b): Top-K compress + decompress of a `size`-entry update, per implementation, with and
    without error feedback, and each stage of the selection timed alone, all on rank 0 while
    the other ranks wait, interleaved with a dense training step (`local_model`, no exchange)
    in `b_repeats` rounds; then every rank compressing at once. Returns seconds per call."""
    import numpy as np
    import tensorflow as tf

    from tfsyncmodes.exchange.compressors import TopKCompressor
    from tfsyncmodes.exchange.flat import TensorContext
    from tfsyncmodes.exchange.memory import ResidualMemory
    from tfsyncmodes.exchange.topk import CANDIDATE_MARGIN, load_native

    flat = tf.constant(np.random.default_rng(2).standard_normal(size).astype("float32"))
    ctx = TensorContext("flat", (size,))
    implementations = ["native", "ops"] if load_native() is not None else ["ops"]
    calls = {}
    for implementation in implementations:
        compressor = TopKCompressor(ratio=FLAGS.topk_ratio, implementation=implementation)
        memory = ResidualMemory()
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
    k = TopKCompressor(ratio=FLAGS.topk_ratio, implementation="ops").k(size)
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
    from tfsyncmodes.testing.faults import SlowWorker
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
    required = strategy.required_callbacks()
    quiet = [c for c in required if not isinstance(c, SlowWorker)]

    def new_models():
        models = {mode: new_model(mode) for mode in ["sync"] + names}
        for model in models.values():  # build, trace, broadcast: the same 3 steps for both
            model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0, callbacks=quiet)
        return models

    models = new_models()

    # (a) bytes per step from the payloads, and (b) the cost of compressing.
    first = new_model("bytes")
    first.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0, callbacks=quiet)
    traffic = first.optimizer.exchange.find(CrossGroupPolicy)[0].link.traffic
    history = first.fit(dataset, epochs=1, steps_per_epoch=20, verbose=0, callbacks=quiet)
    results["bytes_sent_per_step"] = history.history["bytes_sent"][-1]
    results["dense_bytes_per_step"] = traffic.dense_bytes
    results["parameters"] = size = traffic.dense_bytes // 4
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


def time_to(curve, target):
    for _, seconds, loss in curve:
        if loss <= target:
            return seconds
    return None


STAGES = {  # (b)'s breakdown: stage key, what it is
    "call": "an empty tf.function call (dispatch and fetching the result; in every row below)",
    "abs_compare": "ops: abs(x) >= threshold over every entry",
    "where": "ops: tf.where over that mask (the candidates' indices)",
    "sample_top_k": "ops: the strided sample's magnitudes and their top_k (the threshold)",
    "candidates_top_k": "ops: gather the ~1.3 k candidates, abs, top_k among them",
    "gather_values": "ops: gather the k values",
    "segment_sum": "ops: decompress, unsorted_segment_sum into the dense update",
    "scatter_nd": "(alternative) decompress with scatter_nd",
    "chunked_top_k": "(alternative, not exact) top_k of k / rows per row of [n / 4096, 4096]",
    "native_select": "native: sample, one SSE2 pass collecting candidates, nth_element, values",
    "native_scatter": "native: decompress, zeros plus k adds",
}


def shipped_period() -> tuple:
    """(cross_group, updates between two cross-group exchanges) with the shipped defaults:
    periodic compresses once every period updates, stale every update."""
    from tfsyncmodes import config as config_lib

    defaults = config_lib.resolve({"mode": "hybrid"}, environ={}, use_flags=False)
    return defaults.cross_group, (defaults.period if defaults.cross_group == "periodic" else 1)


def compression_report(per_rank, sync_step, docs_dir) -> dict:
    """(b)'s numbers from the worker's rounds, and its section of BENCHMARKS.md."""
    first = per_rank[0]
    rounds, crowd = first["alone_rounds"], [r for rank in per_rank for r in rank["crowd_rounds"]]
    cross_group, period = shipped_period()

    def spread(values, scale=1.0):
        values = [v * scale for v in values]
        return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
                "max": round(max(values), 4)}

    def over_step(name):
        return [r[name] / r["local_step"] for r in rounds]

    result = {"parameters": first["parameters"], "k": first["topk_k"], "repeats": len(rounds),
              "dense_step_no_exchange_ms": spread([r["local_step"] for r in rounds], 1e3),
              "shipped_cross_group": cross_group, "period": period, "target": 0.10, "by_implementation": {},
              "stages": {}}
    for implementation in first["implementations"]:
        one = {}
        for what in ("compress_decompress", "with_error_feedback"):
            name = f"{implementation}.{what}"
            one[what] = {"per_call_ms": spread([r[name] for r in rounds], 1e3),
                         "per_call_over_dense_step": spread(over_step(name)),
                         "per_training_step_over_dense_step": spread([v / period for v in over_step(name)]),
                         "all_ranks_at_once_ms": spread([r[name] for r in crowd], 1e3),
                         "all_ranks_at_once_over_sync_step":
                             round(statistics.median(r[name] for r in crowd) / sync_step, 4)}
        result["by_implementation"][implementation] = one
    for stage in STAGES:
        name = f"stage.{stage}"
        if name in rounds[0]:
            result["stages"][stage] = {"ms": spread([r[name] for r in rounds], 1e3),
                                       "over_dense_step": spread(over_step(name))}
    step = result["dense_step_no_exchange_ms"]
    lines = [
        "## Hybrid: Top-K compression cost",
        "",
        f"`python scripts/bench_hybrid.py --only_b` (part (b) of the hybrid benchmark; the full run writes "
        f"it too) — "
        f"Top-K {FLAGS.topk_ratio:g} of a {result['parameters']:,}-entry update (k = {result['k']:,}), compress "
        f"(selection and values) + decompress (the dense update), one tf.function call each, on rank 0 of a "
        f"horovodrun -np {FLAGS.np} job while the other ranks wait, against a dense training step of the same "
        f"model and batch with no exchange ({step['median']:.3f} ms, {step['min']:.3f}-{step['max']:.3f}), "
        f"interleaved in {len(rounds)} rounds (median of 15 calls each; cells: median of the rounds, their "
        f"range in brackets). Per training step: the shipped cross_group={cross_group} compresses once every "
        f"{period} updates (the knob period), so its cost per step is the per-call cost / {period}.",
        "",
        "| implementation | per call (ms) | per call / dense step | per training step / dense step | "
        "with error feedback, per call / dense step | per training step | all ranks at once / sync step |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(v, digits=3):
        return f"{v['median']:.{digits}f} [{v['min']:.{digits}f}-{v['max']:.{digits}f}]"

    for implementation, one in result["by_implementation"].items():
        plain, memory = one["compress_decompress"], one["with_error_feedback"]
        lines.append(f"| {implementation} | {cell(plain['per_call_ms'])} | "
                     f"**{cell(plain['per_call_over_dense_step'])}** | "
                     f"{cell(plain['per_training_step_over_dense_step'])} | "
                     f"{cell(memory['per_call_over_dense_step'])} | "
                     f"{cell(memory['per_training_step_over_dense_step'])} | "
                     f"{plain['all_ranks_at_once_over_sync_step']:.3f} |")
    lines += ["", "Target: <= 0.10 of a dense step per call. Where the time goes, each stage alone "
              "(same rounds; every row includes one call's dispatch, the first row):", "",
              "| stage | ms | / dense step |", "|---|---:|---:|"]
    for stage, numbers in result["stages"].items():
        lines.append(f"| {STAGES[stage]} | {cell(numbers['ms'])} | {cell(numbers['over_dense_step'])} |")
    lines += ["", COMPRESSION_NOTES, ""]
    replace_section(os.path.join(docs_dir, "BENCHMARKS.md"), "hybrid_compression", "\n".join(lines))
    return result


COMPRESSION_NOTES = (
    "`native` is the compiled pair of kernels `scripts/install.sh` builds (tfsyncmodes/exchange/native); "
    "`ops` is the TensorFlow-ops path used without them (as before). Both select the exact Top-K. Where the "
    "time goes: in `ops`, five steps of similar cost (abs and comparison over every entry, tf.where over the "
    "mask, top_k among the candidates, the sample's top_k, the decompression's dense output), each its own "
    "pass over memory; `native` fuses the selection into one pass over the update (about 0.3 ms of its "
    "select row, timed inside the kernel in a separate run, the rest being the sample's and the candidates' nth_element, about "
    "0.1 ms, and the call) and the decompression into one write of zeros. Levers measured and not taken: "
    "chunked top_k over [n / 4096, 4096] rows (a row per thread) costs a whole dense step, ten times the "
    "exact selection, and is not exact; scatter_nd decompresses no faster than the segment sum; a threshold "
    "reused across calls (Ok-Topk) would save only the sample (under 0.05 ms in `native`). The update is a "
    "Gaussian vector: the sampled threshold's good case (a sample that misleads costs a second pass, then a "
    "pass over every entry, in both; in `ops` the last is a full top_k of several dense steps). The dense "
    "step is one `train_on_batch` call, Keras' per-call overhead included; the Top-K rows also pay one "
    "tf.function call each (first stage row). With error feedback the residual update decompresses again and "
    "subtracts densely (memory.py), which is why that column is about twice the plain one. 'All ranks at "
    "once' has every rank compress together (cores shared) against sync mode's step. The machine is shared: "
    "rounds differ, so the range is given.")


def write_report(per_rank, docs_dir, accuracy=None):
    first = per_rank[0]
    sync_step = statistics.median(s for r in per_rank for s in r["sync_step_s"])
    names = list(json.loads(FLAGS.configs))
    fast = [r for r in range(len(per_rank)) if r >= 2]  # groups 0,1 / 2,3: rank 1 is slowed
    straggler, sync_runs = {}, []
    for repeat in range(FLAGS.repeats):
        # Targets: the loss sync's model has after 1/4, 1/2 and 3/4 of its steps, in this repeat.
        sync_curve = first["sync_curve"][repeat]
        targets = {f"{q}/4": sync_curve[max(0, len(sync_curve) * q // 4 - 1)][2] for q in (1, 2, 3)}
        sync_times = {name: min(t for t in (time_to(r["sync_curve"][repeat], loss) for r in per_rank)
                                if t is not None) for name, loss in targets.items()}
        sync_speed = statistics.mean(per_rank[r]["sync_steps_per_s"][repeat] for r in fast)
        sync_runs.append({"targets": targets, "sync_s": sync_times, "sync_fast_rank_steps_per_s": sync_speed})
        for mode in names:
            speed = statistics.mean(per_rank[r][f"{mode}_steps_per_s"][repeat] for r in fast)
            to_target = {}
            for name, loss in targets.items():
                reached = [t for t in (time_to(r[f"{mode}_curve"][repeat], loss) for r in per_rank) if t is not None]
                to_target[name] = {"target_loss": round(loss, 4), "sync_s": round(sync_times[name], 3),
                                   "hybrid_s": round(min(reached), 3) if reached else None,
                                   "ratio": round(min(reached) / sync_times[name], 3) if reached else None}
            straggler.setdefault(mode, {"knobs": json.loads(FLAGS.configs)[mode], "repeats": []})["repeats"].append({
                "c_time_to_target_loss": to_target,
                "d_fast_group_speed": {"hybrid_steps_per_s": round(speed, 3), "ratio": round(speed / sync_speed, 3)},
                "local_steps": first[f"{mode}_local_steps"][repeat]})
    for mode, part in straggler.items():
        ratios = {name: [r["c_time_to_target_loss"][name]["ratio"] for r in part["repeats"]] for name in ("1/4", "2/4", "3/4")}
        part["c_ratio_median"] = {name: (statistics.median(v) if None not in v else None) for name, v in ratios.items()}
        part["c_ratio_range"] = {name: ([min(v), max(v)] if None not in v else None) for name, v in ratios.items()}
        part["c_meets_target_every_repeat"] = all(None not in v and max(v) <= 0.6 for v in ratios.values())
        part["d_ratio_median"] = statistics.median(r["d_fast_group_speed"]["ratio"] for r in part["repeats"])
    sync_speed = statistics.median(r["sync_fast_rank_steps_per_s"] for r in sync_runs)
    result = {
        "ranks": FLAGS.np, "groups": "0,1;2,3", "parameters": first["parameters"],
        "per_rank_batch": FLAGS.batch_size, "topk_ratio": FLAGS.topk_ratio, "compression": FLAGS.compression,
        "a_cross_group": "stale",
        "a_bytes_per_step": {"topk": first["bytes_sent_per_step"], "dense": first["dense_bytes_per_step"],
                             "ratio": round(first["bytes_sent_per_step"] / first["dense_bytes_per_step"], 4),
                             "target": 0.025},
        "b_compress_cost": compression_report(per_rank, sync_step, docs_dir),
        "straggler": {"slow_worker": "1:4.0", "sync_steps": FLAGS.steps,
                      "hybrid_steps": FLAGS.steps * FLAGS.hybrid_steps_factor, "speed_steps": FLAGS.speed_steps,
                      "repeats": FLAGS.repeats, "sync_fast_rank_steps_per_s": round(sync_speed, 3),
                      "sync_runs": sync_runs, "by_config": straggler},
    }
    result["e_digits_accuracy"] = accuracy
    os.makedirs(docs_dir, exist_ok=True)
    with open(os.path.join(docs_dir, "bench_hybrid.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    a = result["a_bytes_per_step"]
    table = [
        "## Hybrid: Top-K bytes, compression cost, time to a target loss and speed with a straggler",
        "",
        f"`python scripts/bench_hybrid.py` — horovodrun -np {FLAGS.np} on one host, groups of 2, MLP of "
        f"{result['parameters']:,} parameters, batch {FLAGS.batch_size} per rank, Adam, "
        f"compression={FLAGS.compression} (Top-K {FLAGS.topk_ratio:g}) with error feedback, "
        "cross_group=stale for (a) (an exchange every step); (c), (d) on the configurations below.",
        "",
        "| measure | hybrid | reference | ratio | target |",
        "|---|---:|---:|---:|---:|",
        f"| (a) cross-group bytes per step | {a['topk']:,.0f} | dense float32 {a['dense']:,} | {a['ratio']:.4f} | <= 0.025 |",
    ]
    table.append("| (b) Top-K compress + decompress, one rank alone, over a dense step | see "
                 "*Hybrid: Top-K compression cost* below | | | <= 0.10 |")
    # Every run of (c), (d) and (e) is kept (docs/bench_hybrid_runs.json), misses included.
    log_path = os.path.join(docs_dir, "bench_hybrid_runs.json")
    runs = json.load(open(log_path, encoding="utf-8")) if os.path.exists(log_path) else []
    from tfsyncmodes import config as config_lib

    shipped = config_lib.resolve({"mode": "hybrid"}, environ={}, use_flags=False)
    runs.append({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": LOAD[0],
                 "shipped_defaults": {k: getattr(shipped, k) for k in (
                     "cross_group", "staleness", "period", "local_steps", "compression", "topk_ratio", "outer_optimizer")},
                 "load_after": os.getloadavg()[0], "repeats": FLAGS.repeats, "steps": FLAGS.steps,
                 "hybrid_steps": FLAGS.steps * FLAGS.hybrid_steps_factor,
                 "sync_s": [{k: round(v, 2) for k, v in r["sync_s"].items()} for r in sync_runs],
                 "accuracy": result.get("e_digits_accuracy"),
                 "configs": {mode: {k: part[k] for k in ("knobs", "c_ratio_median", "c_ratio_range",
                                                         "c_meets_target_every_repeat", "d_ratio_median")}
                             | {"local_steps": part["repeats"][-1]["local_steps"]}
                             for mode, part in straggler.items()}})
    with open(log_path, "w", encoding="utf-8") as handle:
        json.dump(runs, handle, indent=1)
    d_sync = sync_speed
    for mode in names:
        part = straggler[mode]
        table.append(f"| (d) {mode}: steps/s of a fast-group rank, rank 1 slowed 4x (median of {FLAGS.repeats}) | "
                     f"{statistics.median(r['d_fast_group_speed']['hybrid_steps_per_s'] for r in part['repeats']):.2f} "
                     f"| sync {d_sync:.2f} | {part['d_ratio_median']:.3f} | > 1 |")
    table += [
        "",
        "(c) time to a target loss with rank 1 slowed 4x, hybrid over sync (target <= 0.6 at every target), "
        "the targets being the losses sync's model has after 1/4, 1/2 and 3/4 of its steps in the same "
        "repeat. Every run of this benchmark is listed (docs/bench_hybrid_runs.json), the ones that "
        "miss the target included; a cell is the median ratio over the run's repeats and its range. "
        "Load: the machine's 1-minute load average before and after the run (2 cores, shared).",
        "",
        "| run | configuration (knobs over the shipped defaults) | 1/4 | 2/4 | 3/4 | meets <= 0.6 in every repeat | "
        "(d) fast-group speed / sync | inner steps per round (slow group, fast group) |",
        "|---|---|---:|---:|---:|---|---:|---|",
    ]
    for run in runs:
        for mode, part in run["configs"].items():
            cells = []
            for name in ("1/4", "2/4", "3/4"):
                med, span = part["c_ratio_median"][name], part["c_ratio_range"][name]
                cells.append("not reached" if med is None else f"**{med:.2f}** ({span[0]:.2f}-{span[1]:.2f})")
            steps = part.get("local_steps") or {}
            inner = (f"{steps.get('local_steps_group0', 0):.2f}, {steps.get('local_steps_group1', 0):.2f}"
                     if steps else "")
            knobs = json.dumps(part["knobs"]) if part["knobs"] else "shipped defaults"
            table.append(f"| {run['date']}, load {run['load_before']:.1f}/{run['load_after']:.1f}, "
                         f"{run['repeats']} repeats | {mode}: `{knobs}` | " + " | ".join(cells) +
                         f" | {'yes' if part['c_meets_target_every_repeat'] else 'no'} | {part['d_ratio_median']:.2f} | {inner} |")
    accuracy_runs = [r for r in runs if r.get("accuracy")]
    if accuracy_runs:
        table += ["", "(e) test accuracy on digits, no straggler (`scripts/train.py`, horovodrun -np "
                  f"{FLAGS.np}, {FLAGS.accuracy_epochs} epochs; target: hybrid within 1 point of sync):", "",
                  "| run | sync | hybrid | configuration | difference (points) |", "|---|---:|---:|---|---:|"]
        for run in accuracy_runs:
            e = run["accuracy"]
            table.append(f"| {run['date']} | {e['sync']:.4f} | {e['hybrid']:.4f} | {e['config']} | "
                         f"{100 * (e['hybrid'] - e['sync']):+.2f} |")
    table += [
        "",
        f"(c): sync runs {FLAGS.steps} steps; hybrid runs "
        f"{FLAGS.steps * FLAGS.hybrid_steps_factor} steps (with local_steps=auto the epoch ends when the fast "
        "group has run them, the slow group having run fewer) and the time is that of the first rank whose "
        "model reaches the target (evaluation time excluded). Both modes start from the same fresh "
        f"model. (d) averages ranks 2 and 3 over {FLAGS.speed_steps} steps per mode, run one mode after "
        "the other in the same job.",
        "",
        "Read with care: (c) times the model of the group that gets there first (during training each "
        "group holds its own model; the run's final model is their mean, which is not what is timed). "
        "(d) is per-step throughput: it leaves out the wait at the end of training, where the fast "
        "group waits for the slow one, so a job's wall time is still set by its slowest group.",
        "",
    ]
    replace_section(os.path.join(docs_dir, "BENCHMARKS.md"), "hybrid", "\n".join(table))
    return result


def main(argv):
    del argv
    if FLAGS.worker_out:
        worker(FLAGS.worker_out)
        return
    per_rank = run_ranks("bench_hybrid", FLAGS.np, __file__, [
        f"--steps={FLAGS.steps}", f"--speed_steps={FLAGS.speed_steps}", f"--configs={FLAGS.configs}",
        f"--repeats={FLAGS.repeats}",
        f"--hybrid_steps_factor={FLAGS.hybrid_steps_factor}", f"--compression={FLAGS.compression}",
        f"--batch_size={FLAGS.batch_size}",
        f"--features={FLAGS.features}", f"--hidden={FLAGS.hidden}", f"--topk_ratio={FLAGS.topk_ratio}",
        f"--only_b={FLAGS.only_b}", f"--b_repeats={FLAGS.b_repeats}"],
        timeout=3600)
    if FLAGS.only_b:
        sync_step = statistics.median(s for r in per_rank for s in r["sync_step_s"])
        path = os.path.join(FLAGS.docs_dir, "bench_hybrid.json")
        previous = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else {}
        previous["b_compress_cost"] = compression_report(per_rank, sync_step, FLAGS.docs_dir)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(previous, handle, indent=2)
        print(json.dumps(previous["b_compress_cost"], indent=2))
        return
    accuracy = digits_accuracy() if FLAGS.accuracy_config else None
    report = write_report(per_rank, FLAGS.docs_dir, accuracy)
    summary = {k: report[k] for k in ("a_bytes_per_step", "b_compress_cost", "e_digits_accuracy")}
    summary["straggler"] = {mode: {k: v for k, v in part.items() if k != "repeats"}
                            for mode, part in report["straggler"]["by_config"].items()}
    print(json.dumps(summary, indent=2))


def digits_accuracy():
    """(e): scripts/train.py on digits under horovodrun, no straggler: sync, then hybrid with
    --accuracy_config; each run's test accuracy from its metrics file."""
    import tempfile

    from tfsyncmodes.testing import localrun

    knobs = json.loads(FLAGS.configs)[FLAGS.accuracy_config]
    train = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFSYNC_")}
    found = {"config": FLAGS.accuracy_config + (f" {json.dumps(knobs)}" if knobs else "")}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("sync", "hybrid"):
            extra = [f"--sync_{k}={v}" for k, v in knobs.items()] if mode == "hybrid" else []
            metrics = os.path.join(tmp, f"{mode}.json")
            command = [sys.executable, train, f"--sync_mode={mode}", f"--epochs={FLAGS.accuracy_epochs}",
                       f"--model_dir={os.path.join(tmp, mode)}", f"--metrics_file={metrics}"] + extra
            if mode == "hybrid":
                command.append("--sync_group_size=2")
            result = localrun.run(localrun.horovodrun_command(FLAGS.np, command), timeout=1800,
                                  env=dict(env, TF_CPP_MIN_LOG_LEVEL="2"))
            if result.returncode != 0:
                sys.stderr.write(result.stdout[-3000:] + result.stderr[-3000:])
                sys.exit(f"bench_hybrid (e): the {mode} run failed with status {result.returncode}")
            with open(metrics, encoding="utf-8") as handle:
                found[mode] = json.load(handle)["test_accuracy"]
    return found


if __name__ == "__main__":
    app.run(main)
