"""Benchmark: the cost of ``wrap(opt, "sync")`` + ``model.fit`` against a hand-written loop.

    python scripts/bench_sync.py [--np=2] [--steps=300] [--repeats=5]

Starts one ``horovodrun -np N`` job in which every rank times, on the same model and data and
interleaved to share the machine's noise:

  manual       tf.GradientTape + hvd.grouped_allreduce + optimizer.apply_gradients
  wrapped_loop the same loop, but applying through tfsyncmodes.wrap(opt, "sync")
  fit          model.compile(optimizer=tfsyncmodes.wrap(opt, "sync")) + model.fit

and reports median step times and the ratio fit / manual (target <= 1.05). wrapped_loop
separates the wrapper's own cost from Keras' fit machinery. Results go to
docs/bench_sync.json and the table in docs/BENCHMARKS.md.
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

flags.DEFINE_integer("np", 2, "Horovod ranks.")
flags.DEFINE_integer("steps", 300, "Steps per timed run.")
flags.DEFINE_integer("repeats", 5, "Timed runs per variant (interleaved); the median counts.")
flags.DEFINE_integer("batch_size", 128, "Per-rank batch size.")
flags.DEFINE_integer("features", 256, "Input features.")
flags.DEFINE_integer("hidden", 512, "Hidden units (two hidden layers).")
flags.DEFINE_string("worker_out", None, "Internal: set when running as a rank of the job.")
flags.DEFINE_string("docs_dir", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs"),
                    "Where bench_sync.json and BENCHMARKS.md go.")
FLAGS = flags.FLAGS


def worker(out_path: str) -> None:
    import numpy as np
    import tensorflow as tf

    import tfsyncmodes
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

    fit_model = new_model()
    fit_model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.Adam(1e-3), "sync"), loss=loss_fn,
                      jit_compile=False)
    fit_callbacks = strategy.required_callbacks()

    def run_fit(steps):
        history = fit_model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0,
                                callbacks=fit_callbacks)
        return history.history["loss"][-1]

    variants = {
        "manual": make_loop(keras.optimizers.Adam(1e-3), exchange_in_loop=True),
        "wrapped_loop": make_loop(tfsyncmodes.wrap(keras.optimizers.Adam(1e-3), "sync"), exchange_in_loop=False),
        "fit": run_fit,
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
            json.dump(times, handle)


def write_report(times, docs_dir):
    median = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "ranks": FLAGS.np, "steps_per_run": FLAGS.steps, "repeats": FLAGS.repeats,
        "per_rank_batch": FLAGS.batch_size,
        "parameters": FLAGS.features * FLAGS.hidden + FLAGS.hidden * FLAGS.hidden + FLAGS.hidden * 10
        + 2 * FLAGS.hidden + 10,
        "median_step_ms": {k: round(v * 1e3, 3) for k, v in median.items()},
        "all_step_ms": {k: [round(t * 1e3, 3) for t in v] for k, v in times.items()},
        "ratio_fit_over_manual": round(median["fit"] / median["manual"], 3),
        "ratio_wrapped_loop_over_manual": round(median["wrapped_loop"] / median["manual"], 3),
        "target_ratio": 1.05,
    }
    os.makedirs(docs_dir, exist_ok=True)
    with open(os.path.join(docs_dir, "bench_sync.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    table = [
        "## Sync: `wrap(opt, \"sync\")` + `model.fit` vs a hand-written Horovod loop",
        "",
        f"`python scripts/bench_sync.py` — horovodrun -np {FLAGS.np} on one host, MLP of "
        f"{result['parameters']:,} parameters, batch {FLAGS.batch_size} per rank, "
        f"{FLAGS.repeats} interleaved runs of {FLAGS.steps} steps, medians.",
        "",
        "| variant | median step (ms) | ratio to manual |",
        "|---|---:|---:|",
    ]
    for name in ("manual", "wrapped_loop", "fit"):
        table.append(f"| {name} | {result['median_step_ms'][name]:.3f} | "
                     f"{median[name] / median['manual']:.3f} |")
    table += ["", f"Target: fit / manual <= 1.05; measured {result['ratio_fit_over_manual']:.3f}.", ""]
    replace_section(os.path.join(docs_dir, "BENCHMARKS.md"), "sync", "\n".join(table))
    return result


def main(argv):
    del argv
    if FLAGS.worker_out:
        worker(FLAGS.worker_out)
        return
    times = run_ranks("bench_sync", FLAGS.np, __file__, [
        f"--steps={FLAGS.steps}", f"--repeats={FLAGS.repeats}", f"--batch_size={FLAGS.batch_size}",
        f"--features={FLAGS.features}", f"--hidden={FLAGS.hidden}"], timeout=1800)
    report = write_report(times, FLAGS.docs_dir)
    print(json.dumps({k: report[k] for k in ("median_step_ms", "ratio_fit_over_manual",
                                             "ratio_wrapped_loop_over_manual")}, indent=2))


if __name__ == "__main__":
    app.run(main)
