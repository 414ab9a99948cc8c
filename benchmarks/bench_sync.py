"""Benchmark: the cost of ``wrap(opt, "sync")`` + ``model.fit`` against a hand-written loop,
and of sync mode's compressed allreduce.

    python -m benchmarks.bench_sync [--np=2,4] [--steps=300] [--repeats=5]

Starts one ``horovodrun -np N`` job per N in which every rank times, on the same model and data
and interleaved to share the machine's noise:

  manual       tf.GradientTape + hvd.grouped_allreduce + optimizer.apply_gradients
  wrapped_loop the same loop, but applying through tfsyncmodes.wrap(opt, "sync")
  fit          model.compile(optimizer=tfsyncmodes.wrap(opt, "sync")) + model.fit
  fit_spe      the same with compile(steps_per_execution=SPE): Keras runs SPE steps per call
  fit_fp16     fit with --sync_compression=fp16
  fit_topk     fit with --sync_compression=topk --sync_topk_ratio=0.01 (error feedback on)
  fit_int8     fit with --sync_compression=int8 (error feedback on): the model as one vector
  fit_int8_tensor  the same with --sync_compression_per_tensor: each gradient on its own

and reports median step times, their spread, the ratios to manual (target fit / manual <=
1.05) and the bytes each rank sends per step. wrapped_loop separates the wrapper's own cost
from Keras' fit machinery. Results go to docs/bench_sync.json and docs/BENCHMARKS.md.
"""
from __future__ import annotations

import json
import os
import statistics
import time

from scripts.quietstart import import_tensorflow_quietly

import_tensorflow_quietly()

from absl import app, flags  # noqa: E402

from benchmarks.benchlib import DOCS, replace_section, run_ranks  # noqa: E402

flags.DEFINE_list("np", ["2", "4"], "Horovod rank counts, one job each.")
flags.DEFINE_integer("steps_per_execution", 10, "Keras steps_per_execution of the fit_spe variant.")
flags.DEFINE_integer("steps", 300, "Steps per timed run.")
flags.DEFINE_integer("repeats", 5, "Timed runs per variant (interleaved); the median counts.")
flags.DEFINE_integer("batch_size", 128, "Per-rank batch size.")
flags.DEFINE_integer("features", 256, "Input features.")
flags.DEFINE_integer("hidden", 512, "Hidden units (two hidden layers).")
flags.DEFINE_string("worker_out", None, "Internal: set when running as a rank of the job.")
flags.DEFINE_string("docs_dir", DOCS, "Where bench_sync.json and BENCHMARKS.md go.")
FLAGS = flags.FLAGS


def worker(out_path: str) -> None:
    import numpy as np
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes import faults
    from tfsyncmodes.keras.compat import keras

    strategy = tfsyncmodes.make_strategy("sync", backend="horovod")
    hvd = strategy.hvd
    rng = np.random.default_rng(hvd.rank())
    x = rng.standard_normal((FLAGS.batch_size * 16, FLAGS.features)).astype("float32")
    y = rng.integers(0, 10, size=len(x)).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
        FLAGS.batch_size, drop_remainder=True).prefetch(4)

    def new_model():
        keras.utils.set_random_seed(0)
        return keras.Sequential([
            keras.Input((FLAGS.features,)),
            keras.layers.Dense(FLAGS.hidden, activation="relu"),
            keras.layers.Dense(FLAGS.hidden, activation="relu"),
            keras.layers.Dense(10)])

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def make_loop(optimizer, exchange_in_loop):
        model = new_model()
        iterator = iter(dataset)

        @tf.function(jit_compile=False)
        def step(batch_x, batch_y):
            with tf.GradientTape() as tape:
                loss = loss_fn(batch_y, model(batch_x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            if exchange_in_loop:
                grads = hvd.grouped_allreduce(grads, op=hvd.Average)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        def run(steps):
            for _ in range(steps):
                loss = step(*next(iterator))
            return float(loss)
        return run

    fit_callbacks = strategy.required_callbacks() + faults.callbacks_for(strategy.config, hvd.rank())
    sent = {}

    def make_fit(name, steps_per_execution=1, **knobs):
        model = new_model()
        config = tfsyncmodes.resolve(dict(mode="sync", backend="horovod", **knobs), environ={}, use_flags=False)
        model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.Adam(1e-3), config=config), loss=loss_fn,
                      jit_compile=False, steps_per_execution=steps_per_execution)
        callbacks = fit_callbacks
        if knobs:
            from tfsyncmodes.keras.hybrid_callbacks import WireTrafficLogger

            callbacks = [WireTrafficLogger()] + fit_callbacks

        def run(steps):
            history = model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
            sent[name] = history.history.get("bytes_sent", [None])[-1]
            return history.history["loss"][-1]
        return run

    variants = {
        "manual": make_loop(keras.optimizers.Adam(1e-3), exchange_in_loop=True),
        "wrapped_loop": make_loop(tfsyncmodes.wrap(keras.optimizers.Adam(1e-3), "sync"), exchange_in_loop=False),
        "fit": make_fit("fit"),
        "fit_spe": make_fit("fit_spe", FLAGS.steps_per_execution),
        "fit_fp16": make_fit("fit_fp16", compression="fp16"),
        "fit_topk": make_fit("fit_topk", compression="topk", topk_ratio=0.01),
        "fit_int8": make_fit("fit_int8", compression="int8"),
        "fit_int8_tensor": make_fit("fit_int8_tensor", compression="int8", compression_per_tensor=True),
    }
    for run in variants.values():  # trace and warm up
        run(20)
    times = {name: [] for name in variants}
    for _ in range(FLAGS.repeats):
        for name, run in variants.items():
            hvd.allreduce(tf.constant(0.0), name="bench.barrier")
            started = time.perf_counter()
            run(FLAGS.steps)
            times[name].append((time.perf_counter() - started) / FLAGS.steps)
    if hvd.rank() == 0:
        with open(out_path, "w", encoding="utf-8") as handle:
            json.dump({"times": times, "bytes_sent": sent}, handle)


def spread(values):
    return [round(min(values) * 1e3, 3), round(max(values) * 1e3, 3)]


def write_report(runs, docs_dir):
    parameters = (FLAGS.features * FLAGS.hidden + FLAGS.hidden * FLAGS.hidden + FLAGS.hidden * 10
                  + 2 * FLAGS.hidden + 10)
    result = {"steps_per_run": FLAGS.steps, "repeats": FLAGS.repeats, "per_rank_batch": FLAGS.batch_size,
              "parameters": parameters, "steps_per_execution": FLAGS.steps_per_execution,
              "target_ratio": 1.05, "load_average_1min": round(os.getloadavg()[0], 2), "runs": {}}
    table = [
        "## Sync: `wrap(opt, \"sync\")` + `model.fit` vs a hand-written Horovod loop, and compression",
        "",
        f"`python -m benchmarks.bench_sync` — horovodrun on one 2-core host, MLP of {parameters:,} parameters, "
        f"batch {FLAGS.batch_size} per rank, Adam, {FLAGS.repeats} interleaved runs of {FLAGS.steps} steps "
        "per variant; median step time, [min, max] over the runs, ratio of medians to manual, and the "
        "bytes each rank puts on the wire per step (dense: 4 bytes per parameter).",
        "",
        "| ranks | variant | median step (ms) | spread (ms) | ratio to manual | bytes/step | of dense |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for num_proc, run in runs.items():
        times = run["times"]
        median = {name: statistics.median(values) for name, values in times.items()}
        dense = 4 * parameters
        result["runs"][num_proc] = {
            "median_step_ms": {k: round(v * 1e3, 3) for k, v in median.items()},
            "spread_step_ms": {k: spread(v) for k, v in times.items()},
            "all_step_ms": {k: [round(t * 1e3, 3) for t in v] for k, v in times.items()},
            "ratio_to_manual": {k: round(v / median["manual"], 3) for k, v in median.items()},
            "bytes_sent_per_step": {k: (run["bytes_sent"].get(k) or dense) for k in times if k != "manual"},
        }
        for name in times:
            sent = result["runs"][num_proc]["bytes_sent_per_step"].get(name, dense)
            table.append(f"| {num_proc} | {name} | {median[name] * 1e3:.3f} | {spread(times[name])} | "
                         f"{median[name] / median['manual']:.3f} | {sent:,.0f} | {sent / dense:.3f} |")
    table += ["", "Target: fit / manual <= 1.05. Measured: " + "; ".join(
        f"-np {n}: fit {r['ratio_to_manual']['fit']:.3f}, fit_spe {r['ratio_to_manual']['fit_spe']:.3f}"
        for n, r in result["runs"].items()) + f" (1-minute load average at the end: "
        f"{result['load_average_1min']}).", ""]
    os.makedirs(docs_dir, exist_ok=True)
    with open(os.path.join(docs_dir, "bench_sync.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    replace_section(os.path.join(docs_dir, "BENCHMARKS.md"), "sync", "\n".join(table))
    return result


def main(argv):
    del argv
    if FLAGS.worker_out:
        worker(FLAGS.worker_out)
        return
    runs = {}
    for num_proc in FLAGS.np:
        runs[num_proc] = run_ranks("bench_sync", int(num_proc), "benchmarks.bench_sync", [
            f"--steps={FLAGS.steps}", f"--repeats={FLAGS.repeats}", f"--batch_size={FLAGS.batch_size}",
            f"--features={FLAGS.features}", f"--hidden={FLAGS.hidden}",
            f"--steps_per_execution={FLAGS.steps_per_execution}"], timeout=3000)
    report = write_report(runs, FLAGS.docs_dir)
    print(json.dumps({n: {k: r[k] for k in ("median_step_ms", "ratio_to_manual", "bytes_sent_per_step")}
                      for n, r in report["runs"].items()}, indent=2))


if __name__ == "__main__":
    app.run(main)
