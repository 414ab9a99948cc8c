"""Benchmark: hybrid mode's wire bytes, compression cost, time to a target loss and speed with
a straggler, against sync mode.

    python scripts/bench_hybrid.py [--np=4] [--steps=120] [--speed_steps=40] [--staleness=4,400] [--only_b]

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
  (c) with rank 1 slowed 4x (``--slow_worker=1:4.0``), the time until the model's loss on a
      fixed evaluation batch first reaches a target, hybrid over sync (target <= 0.6), for
      three targets: the losses sync reaches after 1/4, 1/2 and 3/4 of its `steps`; hybrid runs
      `hybrid_steps_factor` times as many steps, so that its fast group can keep training
      while the slow group is still on its way. Both modes start from the same fresh model;
  (d) with rank 1 slowed 4x, the steps per second of a fast-group rank (ranks 2 and 3) in
      hybrid over the same in sync (target > 1): in sync every rank waits for the straggler
      at every step, in hybrid only its own group does and the fast group waits for the
      slow one only once it is `staleness` rounds ahead.

(c) and (d) run once per staleness bound in ``--staleness``: a tight one, under which a
straggler that stays slow holds the fast group to its pace after `staleness` steps, and a
loose one that the run never reaches.

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
flags.DEFINE_list("staleness", ["4", "400"], "Hybrid staleness bounds for (c) and (d), one run each.")
flags.DEFINE_integer("hybrid_steps_factor", 3, "(c): hybrid runs this many times sync's steps.")
flags.DEFINE_enum("cross_group", "stale", ["stale", "periodic"], "Hybrid cross_group for (c) and (d).")
flags.DEFINE_integer("batch_size", 64, "Per-rank batch size.")
flags.DEFINE_integer("features", 256, "Input features.")
flags.DEFINE_integer("hidden", 896, "Hidden units (two hidden layers): about 1M parameters.")
flags.DEFINE_float("topk_ratio", 0.01, "Top-K ratio.")
flags.DEFINE_enum("compression", "topk", ["none", "fp16", "topk"], "Cross-group compression for (c) and (d) "
                  "((a) and (b) measure it as it is; (b) always times Top-K).")
flags.DEFINE_boolean("only_b", False, "Run (a) and (b) only and update (b)'s section of BENCHMARKS.md and its key of "
                     "bench_hybrid.json (skips the straggler runs (c) and (d)).")
flags.DEFINE_integer("b_repeats", 5, "(b): rounds of timings, for the spread.")
flags.DEFINE_string("worker_out", None, "Internal: set when running as a rank of the job.")
flags.DEFINE_string("docs_dir", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs"),
                    "Where bench_hybrid.json and BENCHMARKS.md go.")
FLAGS = flags.FLAGS
EVAL_EVERY = 5


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

    base = {"mode": "hybrid", "group_size": 2, "compression": FLAGS.compression, "topk_ratio": FLAGS.topk_ratio,
            "cross_group": FLAGS.cross_group, "slow_worker": "1:4.0"}
    bounds = [int(b) for b in FLAGS.staleness]
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
        knobs = {"mode": "sync"} if mode == "sync" else dict(base, staleness=int(mode.split("_s")[1]))
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
        models = {mode: new_model(mode) for mode in ["sync"] + [f"hybrid_s{b}" for b in bounds]}
        for model in models.values():  # build, trace, broadcast: the same 3 steps for both
            model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0, callbacks=quiet)
        return models

    models = new_models()

    # (a) bytes per step from the payloads, and (b) the cost of compressing.
    first = models[f"hybrid_s{bounds[0]}"]
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

    # (d) steps per second with rank 1 slowed 4x, each mode in turn.
    for mode, model in models.items():
        clock = StepClock()
        hvd.allreduce(tf.constant(0.0), name=f"bench.barrier.speed.{mode}")
        model.fit(dataset, epochs=1, steps_per_epoch=FLAGS.speed_steps, verbose=0,
                  callbacks=required + [clock])
        results[f"{mode}_steps_per_s"] = (FLAGS.speed_steps - 1) / (clock.last - clock.began)

    # (c) time to the target loss with rank 1 slowed 4x, from fresh models.
    models = new_models()
    for mode, model in models.items():
        clock = LossClock()
        hvd.allreduce(tf.constant(0.0), name=f"bench.barrier.loss.{mode}")
        steps = FLAGS.steps if mode == "sync" else FLAGS.steps * FLAGS.hybrid_steps_factor
        model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=required + [clock])
        results[f"{mode}_curve"] = clock.points
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
    periodic compresses once every staleness + 1 updates, stale every update."""
    from tfsyncmodes import config as config_lib

    defaults = config_lib.resolve({"mode": "hybrid"}, environ={}, use_flags=False)
    return defaults.cross_group, (defaults.staleness + 1 if defaults.cross_group == "periodic" else 1)


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
        f"{period} updates (staleness + 1), so its cost per step is the per-call cost / {period}.",
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


def write_report(per_rank, docs_dir):
    first = per_rank[0]
    bounds = [int(b) for b in FLAGS.staleness]
    sync_step = statistics.median(s for r in per_rank for s in r["sync_step_s"])
    sync_curve = first["sync_curve"]
    # Targets: the loss sync's model has after 1/4, 1/2 and 3/4 of its steps.
    targets = {f"{q}/4": sync_curve[max(0, len(sync_curve) * q // 4 - 1)][2] for q in (1, 2, 3)}
    sync_times = {name: min(t for t in (time_to(r["sync_curve"], loss) for r in per_rank) if t is not None)
                  for name, loss in targets.items()}
    fast = [r for r in range(len(per_rank)) if r >= 2]  # groups 0,1 / 2,3: rank 1 is slowed
    sync_speed = statistics.mean(per_rank[r]["sync_steps_per_s"] for r in fast)
    straggler = {}
    for bound in bounds:
        mode = f"hybrid_s{bound}"
        speed = statistics.mean(per_rank[r][f"{mode}_steps_per_s"] for r in fast)
        to_target = {}
        for name, loss in targets.items():
            times = [time_to(r[f"{mode}_curve"], loss) for r in per_rank]
            reached = [t for t in times if t is not None]
            to_target[name] = {
                "target_loss": round(loss, 4), "sync_s": round(sync_times[name], 3),
                "hybrid_s": round(min(reached), 3) if reached else None,
                "hybrid_s_per_rank": [None if t is None else round(t, 3) for t in times],
                "ratio": round(min(reached) / sync_times[name], 3) if reached else None, "target": 0.6}
        straggler[str(bound)] = {
            "c_time_to_target_loss": to_target,
            "d_fast_group_speed": {
                "hybrid_steps_per_s": round(speed, 3),
                "steps_per_s_per_rank": [round(r[f"{mode}_steps_per_s"], 3) for r in per_rank],
                "ratio": round(speed / sync_speed, 3), "target": "> 1"},
            "curve_rank2": per_rank[2 % len(per_rank)][f"{mode}_curve"]}
    result = {
        "ranks": FLAGS.np, "groups": "0,1;2,3", "parameters": first["parameters"],
        "per_rank_batch": FLAGS.batch_size, "topk_ratio": FLAGS.topk_ratio, "compression": FLAGS.compression,
        "cross_group": FLAGS.cross_group,
        "a_bytes_per_step": {"topk": first["bytes_sent_per_step"], "dense": first["dense_bytes_per_step"],
                             "ratio": round(first["bytes_sent_per_step"] / first["dense_bytes_per_step"], 4),
                             "target": 0.025},
        "b_compress_cost": compression_report(per_rank, sync_step, docs_dir),
        "straggler": {"slow_worker": "1:4.0", "sync_steps": FLAGS.steps,
                      "hybrid_steps": FLAGS.steps * FLAGS.hybrid_steps_factor, "speed_steps": FLAGS.speed_steps,
                      "sync_fast_rank_steps_per_s": round(sync_speed, 3),
                      "sync_steps_per_s_per_rank": [round(r["sync_steps_per_s"], 3) for r in per_rank],
                      "sync_curve": sync_curve, "by_staleness": straggler},
    }
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
        f"cross_group={FLAGS.cross_group}.",
        "",
        "| measure | hybrid | reference | ratio | target |",
        "|---|---:|---:|---:|---:|",
        f"| (a) cross-group bytes per step | {a['topk']:,.0f} | dense float32 {a['dense']:,} | {a['ratio']:.4f} | <= 0.025 |",
    ]
    table.append("| (b) Top-K compress + decompress, one rank alone, over a dense step | see "
                 "*Hybrid: Top-K compression cost* below | | | <= 0.10 |")
    for bound in bounds:
        d = straggler[str(bound)]["d_fast_group_speed"]
        table.append(f"| (d) staleness {bound}: steps/s of a fast-group rank, rank 1 slowed 4x | "
                     f"{d['hybrid_steps_per_s']:.2f} | sync {sync_speed:.2f} | {d['ratio']:.3f} | > 1 |")
    table += [
        "",
        "(c) time to a target loss with rank 1 slowed 4x, hybrid over sync (target <= 0.6), for three "
        "targets: the loss sync's model has after 1/4, 1/2 and 3/4 of its steps.",
        "",
        "| staleness | " + " | ".join(f"loss {loss:.4f} (sync's after {name} of its steps; sync "
                                      f"{sync_times[name]:.1f} s)" for name, loss in targets.items()) + " |",
        "|---:|" + "---:|" * len(targets),
    ]
    for bound in bounds:
        cells = []
        for name in targets:
            c = straggler[str(bound)]["c_time_to_target_loss"][name]
            cells.append("not reached" if c["ratio"] is None else f"{c['hybrid_s']:.1f} s: **{c['ratio']:.3f}**")
        table.append(f"| {bound} | " + " | ".join(cells) + " |")
    table += [
        "",
        f"(c): sync runs {FLAGS.steps} steps; hybrid runs "
        f"{FLAGS.steps * FLAGS.hybrid_steps_factor} steps and the time is that of the first rank whose "
        "model reaches the target (evaluation time excluded). Both modes start from the same fresh "
        f"model. (d) averages ranks 2 and 3 over {FLAGS.speed_steps} steps per mode, run one mode after "
        "the other in the same job. Under the tight bound a straggler that stays slow holds the fast "
        "group to its pace once it is that many steps ahead; the loose bound is never reached in these "
        "runs, so the fast group trains at its own pace and takes in the slow group's updates as they "
        "come.",
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
        f"--steps={FLAGS.steps}", f"--speed_steps={FLAGS.speed_steps}", f"--staleness={','.join(FLAGS.staleness)}",
        f"--hybrid_steps_factor={FLAGS.hybrid_steps_factor}", f"--compression={FLAGS.compression}",
        f"--cross_group={FLAGS.cross_group}", f"--batch_size={FLAGS.batch_size}",
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
    report = write_report(per_rank, FLAGS.docs_dir)
    summary = {k: report[k] for k in ("a_bytes_per_step", "b_compress_cost")}
    summary["straggler"] = {bound: {k: v for k, v in part.items() if k != "curve_rank2"}
                            for bound, part in report["straggler"]["by_staleness"].items()}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    app.run(main)
