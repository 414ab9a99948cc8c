"""Benchmark: async throughput against the sum of the workers' individual rates.

    python -m benchmarks.bench_async [--steps=400] [--workers=2,4]

In one run it starts local clusters (``tfsyncmodes.launch``, 1 ps, one intra-op thread per process)
and measures steps per second of:

  solo        one worker alone                 -> r
  solo_slow   one worker alone, slowed 4x      -> r_slow   (--sync_slow_worker=0:4.0)
  N workers   N workers, worker 1 slowed 4x    -> R_N      (--sync_slow_worker=1:4.0)
  N even      N workers, none slowed           -> E_N

and reports R_N / ((N-1) r + r_slow), the share of the ideal async throughput that one slow
worker leaves (target >= 0.85), and E_N / (N r). Results: docs/bench_async.json and the
`async` section of docs/BENCHMARKS.md. The machine's cores bound the N-worker runs: with
fewer cores than processes the workers share them, and the ratio says so.
"""
from __future__ import annotations

import json
import os
import time

from scripts.quietstart import import_tensorflow_quietly

import_tensorflow_quietly()

from absl import app, flags  # noqa: E402

import tfsyncmodes  # noqa: E402,F401  (defines --sync_slow_worker and the other knobs)
from benchmarks.benchlib import DOCS, async_chief_run, replace_section  # noqa: E402

flags.DEFINE_integer("steps", 400, "Timed steps per cluster run (after 40 warm-up steps).")
flags.DEFINE_list("workers", ["2", "4"], "Worker counts to measure.")
flags.DEFINE_float("slow_factor", 4.0, "How much slower the slow worker runs.")
flags.DEFINE_integer("batch_size", 64, "Batch size of each step.")
flags.DEFINE_bool("report_only", False, "Rewrite the docs table from docs/bench_async.json, measuring nothing.")
flags.DEFINE_string("chief_out", None, "Internal: set when running as the chief of a cluster.")
flags.DEFINE_string("docs_dir", DOCS, "Where bench_async.json and BENCHMARKS.md go.")
FLAGS = flags.FLAGS


def chief(out_path: str) -> None:
    import numpy as np
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras
    from tfsyncmodes.keras.async_runner import async_train_step

    strategy = tfsyncmodes.make_strategy("async")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 128)).astype("float32")
    y = rng.integers(0, 10, len(x)).astype("int32")

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(FLAGS.batch_size).prefetch(4)

    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((128,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.SGD(0.01, momentum=0.9), "async"),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
        model._symbolic_build(data_batch=next(iter(dataset_fn(None))))
    coordinator = strategy.coordinator
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def step(it):
        return strategy.run(lambda data: async_train_step(model, data)["staleness"], args=(next(it),))

    for _ in range(40):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    started = time.perf_counter()
    for _ in range(FLAGS.steps):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    seconds = time.perf_counter() - started
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump({"steps": FLAGS.steps, "seconds": seconds}, handle)


def measure(workers: int, slow_worker: str) -> float:
    """Steps per second of a fresh local cluster."""
    rate = async_chief_run("bench_async", "benchmarks.bench_async", workers,
                           [f"--steps={FLAGS.steps}", f"--batch_size={FLAGS.batch_size}",
                            f"--sync_slow_worker={slow_worker}"], timeout=900)
    steps_per_second = rate["steps"] / rate["seconds"]
    print(f"workers={workers} slow_worker={slow_worker or '-'}: {steps_per_second:.1f} steps/s", flush=True)
    return steps_per_second


def main(argv):
    del argv
    if FLAGS.chief_out:
        chief(FLAGS.chief_out)
        return
    if FLAGS.report_only:
        with open(os.path.join(FLAGS.docs_dir, "bench_async.json"), encoding="utf-8") as handle:
            write_report(json.load(handle))
        return

    slow = f"{FLAGS.slow_factor:g}"
    solo = measure(1, "")
    solo_slow = measure(1, f"0:{slow}")
    rows = []
    for workers in (int(w) for w in FLAGS.workers):
        with_slow = measure(workers, f"1:{slow}")
        even = measure(workers, "")
        ideal_slow = (workers - 1) * solo + solo_slow
        rows.append({"workers": workers, "steps_per_s_one_slow": round(with_slow, 2),
                     "sum_of_individual_rates": round(ideal_slow, 2),
                     "ratio_one_slow": round(with_slow / ideal_slow, 3),
                     "steps_per_s_even": round(even, 2), "ratio_even": round(even / (workers * solo), 3)})
    result = {"cores": os.cpu_count(), "steps_per_run": FLAGS.steps, "batch_size": FLAGS.batch_size,
              "slow_factor": FLAGS.slow_factor, "solo_steps_per_s": round(solo, 2),
              "solo_slow_steps_per_s": round(solo_slow, 2), "runs": rows, "target_ratio_one_slow": 0.85}
    os.makedirs(FLAGS.docs_dir, exist_ok=True)
    with open(os.path.join(FLAGS.docs_dir, "bench_async.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    write_report(result)
    print(json.dumps(result, indent=2))


def write_report(result):
    table = [
        "## Async: throughput with one slow worker vs the sum of individual rates",
        "",
        f"`python -m benchmarks.bench_async` — local cluster (chief, 1 ps, N workers, one intra-op thread each) "
        f"on {result['cores']} cores, MLP 128-256-256-10, batch {result['batch_size']}, "
        f"{result['steps_per_run']} steps per run. One worker alone: {result['solo_steps_per_s']:.1f} steps/s; "
        f"slowed {result['slow_factor']:g}x: {result['solo_slow_steps_per_s']:.1f} steps/s.",
        "",
        "| workers | steps/s, worker 1 slowed | sum of individual rates | ratio | steps/s, none slowed | "
        "ratio to N x solo | slowed ratio / even ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["runs"]:
        table.append(f"| {row['workers']} | {row['steps_per_s_one_slow']:.1f} | {row['sum_of_individual_rates']:.1f} | "
                     f"{row['ratio_one_slow']:.3f} | {row['steps_per_s_even']:.1f} | {row['ratio_even']:.3f} | "
                     f"{row['ratio_one_slow'] / row['ratio_even']:.3f} |")
    table += [
        "",
        f"Target: ratio >= {result['target_ratio_one_slow']} with one slow worker. The individual rates are "
        "measured with the machine to one worker; with more processes than cores (chief, ps and N workers "
        "on these cores) the workers share the cores, which caps even the unslowed cluster (ratio to N x "
        "solo). The last column divides that cap out: at or above 1, a slow worker costs async training "
        "nothing beyond its own missing steps.",
        "",
    ]
    replace_section(os.path.join(FLAGS.docs_dir, "BENCHMARKS.md"), "async", "\n".join(table))


if __name__ == "__main__":
    app.run(main)
