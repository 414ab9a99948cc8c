"""What applying each async step once costs: the library's step against the same step unchecked.

    python -m benchmarks.once_cost [--steps=300] [--rounds=5] [--workers=2]

One local cluster (``tfsyncmodes.launch``, 1 ps, WORKERS workers, one intra-op thread per
process). For each of two models, the fit-like loop's runner (``CoordinatorRunner``) with the check on schedules
STEPS steps and waits for them, in ROUNDS rounds, interleaved with the same steps of a runner
whose worker step leaves out the check (``strategy.run`` of the same train step, no step id,
no unit, no mark: ``--sync_exactly_once=false``). A round's ratio is checked over
unchecked seconds; the table gives the median and range over the rounds. The models: the
digits classifier of the chaos job (64-10, 650 parameters: the check's share is largest) and
``bench_async``'s MLP (128-256-256-10, 101,642 parameters). JSON ``docs/once_cost.json`` and a
section of ``docs/BENCHMARKS.md``.
"""
from __future__ import annotations

import json
import os
import statistics
import time

from scripts.quietstart import import_tensorflow_quietly

import_tensorflow_quietly()

from absl import app, flags  # noqa: E402

import tfsyncmodes  # noqa: E402,F401  (defines the knobs)
from benchmarks.benchlib import DOCS, async_chief_run, replace_section  # noqa: E402

flags.DEFINE_integer("steps", 300, "Steps per round and runner.")
flags.DEFINE_integer("rounds", 5, "Interleaved rounds.")
flags.DEFINE_integer("workers", 2, "Workers in the cluster.")
flags.DEFINE_integer("batch_size", 64, "Batch size of each step.")
flags.DEFINE_bool("report_only", False, "Rewrite the docs table from docs/once_cost.json.")
flags.DEFINE_string("chief_out", None, "Internal: set when running as the chief of a cluster.")
flags.DEFINE_string("docs_dir", DOCS, "Where once_cost.json and BENCHMARKS.md go.")
FLAGS = flags.FLAGS

MODELS = {"digits 64-10": (64, ()), "MLP 128-256-256-10": (128, (256, 256))}


def chief(out_path: str) -> None:
    import numpy as np
    import tensorflow as tf

    from tfsyncmodes.keras.compat import keras
    from tfsyncmodes.keras.async_runner import CoordinatorRunner
    from tfsyncmodes.keras.once import AppliedSteps, AtLeastOnce

    strategy = tfsyncmodes.make_strategy("async")

    class Checked(CoordinatorRunner):
        """The loop's runner with ``--sync_exactly_once`` on."""

        def prepare(self, model, steps_per_epoch):
            super().prepare(model, steps_per_epoch)
            with strategy.scope():
                self._once = AppliedSteps(steps_per_epoch)

    class Unchecked(CoordinatorRunner):
        """The same step without the step id's check and mark (the knob off)."""

        def prepare(self, model, steps_per_epoch):
            super().prepare(model, steps_per_epoch)
            self._once = AtLeastOnce()

    def runner(kind, features, hidden, seed):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((4096, features)).astype("float32")
        y = rng.integers(0, 10, len(x)).astype("int32")

        def dataset_fn(context):
            del context
            return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(FLAGS.batch_size).prefetch(4)

        with strategy.scope():
            keras.utils.set_random_seed(seed)
            layers = [keras.layers.Dense(units, activation="relu") for units in hidden]
            model = keras.Sequential([keras.Input((features,)), *layers, keras.layers.Dense(10)])
            model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.SGD(0.01), "async"),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"], jit_compile=False)
        made = kind(strategy, dataset_fn)
        made.prepare(model, FLAGS.steps)
        return made, model.count_params()

    def epoch(made):
        started = time.perf_counter()
        for _ in range(FLAGS.steps):
            made.step()
        logs = made.epoch_logs({})
        assert int(logs["steps"]) == FLAGS.steps, logs
        return time.perf_counter() - started

    results = {}
    for seed, (name, (features, hidden)) in enumerate(MODELS.items()):
        checked, params = runner(Checked, features, hidden, seed)
        unchecked, _ = runner(Unchecked, features, hidden, seed)
        epoch(checked), epoch(unchecked)  # traces and warm-up
        rounds = []
        for index in range(FLAGS.rounds):
            order = (checked, unchecked) if index % 2 == 0 else (unchecked, checked)
            seconds = {id(made): epoch(made) for made in order}
            rounds.append({"checked": seconds[id(checked)], "unchecked": seconds[id(unchecked)]})
        results[name] = {"parameters": params, "rounds": rounds}
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(results, handle)


def measure() -> dict:
    return async_chief_run("once_cost", "benchmarks.once_cost", FLAGS.workers,
                           [f"--steps={FLAGS.steps}", f"--rounds={FLAGS.rounds}",
                            f"--batch_size={FLAGS.batch_size}"], timeout=1500)


def spread(values, digits=3):
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def write_report(result):
    table = [
        "## Async steps applied once",
        "",
        f"`python -m benchmarks.once_cost --steps={result['steps']} --rounds={result['rounds']} "
        f"--workers={result['workers']}`: a local cluster (chief, 1 ps, {result['workers']} workers, one "
        f"intra-op thread each) on {result['cores']} cores, batch {result['batch_size']}. Each round "
        "times the fit-like loop's runner over the steps (each step's id checked on the ps first, "
        "its writes made as one unit on the ps and marked after them: `tfsyncmodes/keras/once.py`) "
        "and the same steps unchecked, in alternating order; median [range] over the rounds.",
        "",
        "| model | parameters | ms per step, checked | ms per step, unchecked | checked / unchecked |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in result["models"].items():
        per_step = lambda key: [1000 * r[key] / result["steps"] for r in row["rounds"]]  # noqa: E731
        ratios = [r["checked"] / r["unchecked"] for r in row["rounds"]]
        table.append(f"| {name} | {row['parameters']:,} | {spread(per_step('checked'), 2)} | "
                     f"{spread(per_step('unchecked'), 2)} | {spread(ratios)} |")
    added = [statistics.median(1000 * (r["checked"] - r["unchecked"]) / result["steps"] for r in row["rounds"])
             for row in result["models"].values()]
    table += [
        "",
        f"Applying each step once adds {min(added):.1f}-{max(added):.1f} ms to a step here (medians per "
        "model): the step's id is read from the ps before the step writes, the writes wait for all of "
        "the step's values to be on the ps, and the mark follows them. These 5-8 ms steps are the worst "
        "case (a model this small does almost nothing else); at the 50-400 ms steps the bed emulates, "
        "or the chaos job's 80 ms, the same milliseconds are a few percent. `--sync_exactly_once` is on "
        "by default (fault-tolerance.md says what it covers).",
        "",
    ]
    replace_section(os.path.join(FLAGS.docs_dir, "BENCHMARKS.md"), "once", "\n".join(table))


def main(argv):
    del argv
    if FLAGS.chief_out:
        chief(FLAGS.chief_out)
        return
    path = os.path.join(FLAGS.docs_dir, "once_cost.json")
    if FLAGS.report_only:
        with open(path, encoding="utf-8") as handle:
            write_report(json.load(handle))
        return
    result = {"cores": os.cpu_count(), "steps": FLAGS.steps, "rounds": FLAGS.rounds,
              "workers": FLAGS.workers, "batch_size": FLAGS.batch_size, "models": measure()}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    write_report(result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    app.run(main)
