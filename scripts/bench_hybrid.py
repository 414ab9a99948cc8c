"""Benchmark: hybrid mode's wire bytes, compression cost, time to a target loss and speed with
a straggler, against sync mode.

    python scripts/bench_hybrid.py [--np=4] [--steps=120] [--speed_steps=40]

Starts one ``horovodrun -np N`` job (groups of 2) on an MLP of about 1M parameters. Every
rank measures, interleaved with sync mode on the same model and data:

  (a) bytes on the cross-group wire per step, Top-K 1 % (float32 values + int32 indices),
      from the payloads the exchange really sent, over a dense float32 exchange
      (target <= 0.025);
  (b) Top-K compress + decompress + error-feedback time for the whole update, over the
      median step time of sync mode (target <= 0.10);
  (c) with rank 1 slowed 4x (``--slow_worker=1:4.0``), the time until the model's loss on a
      fixed evaluation batch first reaches a target, hybrid (staleness 4) over sync
      (target <= 0.6). The target is the loss sync reaches after 3/4 of its steps. Both
      modes start from the same fresh model, so neither has trained longer before the clock;
  (d) with rank 1 slowed 4x, the steps per second of a fast-group rank (ranks 2 and 3) in
      hybrid over the same in sync (target > 1): in sync every rank waits for the straggler
      at every step, in hybrid only its own group does and the fast group waits for the
      slow one at most once it is `staleness` rounds ahead.

Results go to docs/bench_hybrid.json and the ``hybrid`` section of docs/BENCHMARKS.md.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from scripts.benchlib import replace_section, run_ranks  # noqa: E402

flags.DEFINE_integer("np", 4, "Horovod ranks (groups of 2).")
flags.DEFINE_integer("steps", 120, "Steps of each timed straggler run (c).")
flags.DEFINE_integer("speed_steps", 40, "Steps of each timed speed run (d).")
flags.DEFINE_integer("staleness", 4, "Hybrid staleness for (c) and (d).")
flags.DEFINE_enum("cross_group", "stale", ["stale", "periodic"], "Hybrid cross_group for (c) and (d).")
flags.DEFINE_integer("batch_size", 64, "Per-rank batch size.")
flags.DEFINE_integer("features", 256, "Input features.")
flags.DEFINE_integer("hidden", 896, "Hidden units (two hidden layers): about 1M parameters.")
flags.DEFINE_float("topk_ratio", 0.01, "Top-K ratio.")
flags.DEFINE_string("worker_out", None, "Internal: set when running as a rank of the job.")
flags.DEFINE_string("docs_dir", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs"),
                    "Where bench_hybrid.json and BENCHMARKS.md go.")
FLAGS = flags.FLAGS
EVAL_EVERY = 5


def worker(out_path: str) -> None:
    import numpy as np
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes import config as config_lib
    from tfsyncmodes.exchange import hybrid
    from tfsyncmodes.keras.callbacks import SlowWorker
    from tfsyncmodes.keras.compat import keras

    base = {"mode": "hybrid", "group_size": 2, "compression": "topk", "topk_ratio": FLAGS.topk_ratio,
            "staleness": FLAGS.staleness, "cross_group": FLAGS.cross_group, "slow_worker": "1:4.0"}
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
        model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.Adam(1e-3), mode), loss=loss_fn,
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
        models = {mode: new_model(mode) for mode in ("sync", "hybrid")}
        for model in models.values():  # build, trace, broadcast: the same 3 steps for both
            model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0, callbacks=quiet)
        return models

    models = new_models()

    # (a) bytes per step from the payloads, and (b) the cost of compressing.
    traffic = hybrid.exchange_parts(models["hybrid"].optimizer)[0].traffic
    history = models["hybrid"].fit(dataset, epochs=1, steps_per_epoch=20, verbose=0, callbacks=quiet)
    results["bytes_sent_per_step"] = history.history["bytes_sent"][-1]
    results["dense_bytes_per_step"] = traffic.dense_bytes
    results["parameters"] = traffic.dense_bytes // 4
    results["sync_step_s"] = []
    for _ in range(3):
        hvd.allreduce(tf.constant(0.0), name="bench.barrier")
        started = time.perf_counter()
        models["sync"].fit(dataset, epochs=1, steps_per_epoch=20, verbose=0, callbacks=quiet)
        results["sync_step_s"].append((time.perf_counter() - started) / 20)
    flat = tf.constant(np.random.default_rng(2).standard_normal(results["parameters"]).astype("float32"))
    from tfsyncmodes.exchange.compressors import TopKCompressor
    from tfsyncmodes.exchange.memory import ResidualMemory

    compressor, memory = TopKCompressor(FLAGS.topk_ratio), ResidualMemory()
    memory.build(results["parameters"])

    @tf.function
    def compress_round_trip(update):
        compensated = memory.compensate(update)
        payload = compressor.compress(compensated)
        remembered = memory.update(compensated, payload, compressor)
        with tf.control_dependencies([remembered]):
            return compressor.decompress(payload, results["parameters"])

    compress_round_trip(flat)
    results["compress_s"] = []
    for _ in range(20):
        started = time.perf_counter()
        compress_round_trip(flat).numpy()
        results["compress_s"].append(time.perf_counter() - started)

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
        model.fit(dataset, epochs=1, steps_per_epoch=FLAGS.steps, verbose=0, callbacks=required + [clock])
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


def write_report(per_rank, docs_dir):
    first = per_rank[0]
    sync_step = statistics.median(s for r in per_rank for s in r["sync_step_s"])
    compress = statistics.median(s for r in per_rank for s in r["compress_s"])
    sync_curve = first["sync_curve"]
    target = sync_curve[max(0, len(sync_curve) * 3 // 4 - 1)][2]
    sync_time = min(t for t in (time_to(r["sync_curve"], target) for r in per_rank) if t is not None)
    hybrid_times = [time_to(r["hybrid_curve"], target) for r in per_rank]
    reached = [t for t in hybrid_times if t is not None]
    hybrid_time = min(reached) if reached else None
    fast = [r for r in range(len(per_rank)) if r >= 2]  # groups 0,1 / 2,3: rank 1 is slowed
    speed = {mode: statistics.mean(per_rank[r][f"{mode}_steps_per_s"] for r in fast) for mode in ("sync", "hybrid")}
    result = {
        "ranks": FLAGS.np, "groups": "0,1;2,3", "parameters": first["parameters"],
        "per_rank_batch": FLAGS.batch_size, "topk_ratio": FLAGS.topk_ratio, "staleness": FLAGS.staleness,
        "cross_group": FLAGS.cross_group,
        "a_bytes_per_step": {"topk": first["bytes_sent_per_step"], "dense": first["dense_bytes_per_step"],
                             "ratio": round(first["bytes_sent_per_step"] / first["dense_bytes_per_step"], 4),
                             "target": 0.025},
        "b_compress_cost": {"compress_decompress_ms": round(compress * 1e3, 3),
                            "sync_step_ms": round(sync_step * 1e3, 3),
                            "ratio": round(compress / sync_step, 4), "target": 0.10},
        "c_time_to_target_loss": {"slow_worker": "1:4.0", "steps": FLAGS.steps, "target_loss": round(target, 4),
                                  "sync_s": round(sync_time, 3),
                                  "hybrid_s": None if hybrid_time is None else round(hybrid_time, 3),
                                  "hybrid_s_per_rank": [None if t is None else round(t, 3) for t in hybrid_times],
                                  "ratio": None if hybrid_time is None else round(hybrid_time / sync_time, 3),
                                  "target": 0.6},
        "d_fast_group_speed": {"slow_worker": "1:4.0", "steps": FLAGS.speed_steps, "fast_ranks": fast,
                               "hybrid_steps_per_s": round(speed["hybrid"], 3),
                               "sync_steps_per_s": round(speed["sync"], 3),
                               "steps_per_s_per_rank": {mode: [round(r[f"{mode}_steps_per_s"], 3) for r in per_rank]
                                                        for mode in ("sync", "hybrid")},
                               "ratio": round(speed["hybrid"] / speed["sync"], 3), "target": "> 1"},
        "curves": {"sync": sync_curve, "hybrid_rank2": per_rank[2 % len(per_rank)]["hybrid_curve"]},
    }
    os.makedirs(docs_dir, exist_ok=True)
    with open(os.path.join(docs_dir, "bench_hybrid.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    a, b, c = result["a_bytes_per_step"], result["b_compress_cost"], result["c_time_to_target_loss"]
    d = result["d_fast_group_speed"]
    ratio_c = "not reached" if c["ratio"] is None else f"{c['ratio']:.3f}"
    table = [
        "## Hybrid: Top-K bytes, compression cost, time to a target loss and speed with a straggler",
        "",
        f"`python scripts/bench_hybrid.py` — horovodrun -np {FLAGS.np} on one host, groups of 2, MLP of "
        f"{result['parameters']:,} parameters, batch {FLAGS.batch_size} per rank, Top-K "
        f"{FLAGS.topk_ratio:g} with error feedback, staleness {FLAGS.staleness} (cross_group={FLAGS.cross_group}).",
        "",
        "| measure | hybrid | reference | ratio | target |",
        "|---|---:|---:|---:|---:|",
        f"| (a) cross-group bytes per step | {a['topk']:,.0f} | dense float32 {a['dense']:,} | {a['ratio']:.4f} | <= 0.025 |",
        f"| (b) compress + decompress (ms) | {b['compress_decompress_ms']:.3f} | sync step {b['sync_step_ms']:.3f} | "
        f"{b['ratio']:.4f} | <= 0.10 |",
        f"| (c) time to loss {c['target_loss']} with rank 1 slowed 4x (s) | "
        f"{'-' if c['hybrid_s'] is None else c['hybrid_s']} | sync {c['sync_s']} | {ratio_c} | <= 0.6 |",
        f"| (d) steps/s of a fast-group rank with rank 1 slowed 4x | {d['hybrid_steps_per_s']:.2f} | "
        f"sync {d['sync_steps_per_s']:.2f} | {d['ratio']:.3f} | > 1 |",
        "",
        "(c) takes the first rank whose model reaches the target (the fast group can run up to "
        "`staleness` steps ahead); evaluation time is excluded. Both modes start from the same "
        "fresh model. (d) averages ranks 2 and 3 over "
        f"{FLAGS.speed_steps} steps per mode, run one mode after the other in the same job.",
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
        f"--steps={FLAGS.steps}", f"--speed_steps={FLAGS.speed_steps}", f"--staleness={FLAGS.staleness}",
        f"--cross_group={FLAGS.cross_group}", f"--batch_size={FLAGS.batch_size}",
        f"--features={FLAGS.features}", f"--hidden={FLAGS.hidden}", f"--topk_ratio={FLAGS.topk_ratio}"],
        timeout=3600)
    report = write_report(per_rank, FLAGS.docs_dir)
    print(json.dumps({k: report[k] for k in ("a_bytes_per_step", "b_compress_cost", "c_time_to_target_loss",
                                                        "d_fast_group_speed")},
                     indent=2))


if __name__ == "__main__":
    app.run(main)
