"""Benchmark: hybrid mode's wire bytes, compression cost, time to a target loss and speed with
a straggler, against sync mode.

    python -m benchmarks.bench_hybrid [--np=4] [--steps=120] [--speed_steps=40] [--repeats=3] [--only_b]
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
This module starts the job and runs (e); the flags are in :mod:`benchmarks.hybrid_flags`, what
each rank measures in :mod:`benchmarks.hybrid_worker` (the job runs this module again as its
ranks, with ``--worker_out``), the report in :mod:`benchmarks.hybrid_report`.
"""
from __future__ import annotations

import json
import os
import statistics

from scripts.quietstart import import_tensorflow_quietly

import_tensorflow_quietly()

from absl import app, flags  # noqa: E402

from benchmarks import hybrid_flags, hybrid_report  # noqa: E402
from benchmarks.benchlib import run_ranks, train_metrics  # noqa: E402
from benchmarks.hybrid_flags import FLAGS  # noqa: E402
from benchmarks.hybrid_worker import worker  # noqa: E402

flags.adopt_module_key_flags(hybrid_flags)  # --help lists them, as this module's own


def main(argv):
    del argv
    if FLAGS.worker_out:
        worker(FLAGS.worker_out)
        return
    per_rank = run_ranks("bench_hybrid", FLAGS.np, "benchmarks.bench_hybrid", [
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
        previous["b_compress_cost"] = hybrid_report.compression_report(per_rank, sync_step, FLAGS.docs_dir)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(previous, handle, indent=2)
        print(json.dumps(previous["b_compress_cost"], indent=2))
        return
    accuracy = digits_accuracy() if FLAGS.accuracy_config else None
    report = hybrid_report.write_report(per_rank, FLAGS.docs_dir, accuracy)
    summary = {k: report[k] for k in ("a_bytes_per_step", "b_compress_cost", "e_digits_accuracy")}
    summary["straggler"] = {mode: {k: v for k, v in part.items() if k != "repeats"}
                            for mode, part in report["straggler"]["by_config"].items()}
    print(json.dumps(summary, indent=2))


def digits_accuracy():
    """(e): scripts/train.py on digits under horovodrun, no straggler: sync, then hybrid with
    --accuracy_config; each run's test accuracy from its metrics file."""
    knobs = json.loads(FLAGS.configs)[FLAGS.accuracy_config]
    found = {"config": FLAGS.accuracy_config + (f" {json.dumps(knobs)}" if knobs else "")}
    for mode in ("sync", "hybrid"):
        extra = [f"--sync_{k}={v}" for k, v in knobs.items()] + ["--sync_group_size=2"] if mode == "hybrid" else []
        metrics = train_metrics(f"bench_hybrid (e): the {mode} run", FLAGS.np,
                                [f"--sync_mode={mode}", f"--epochs={FLAGS.accuracy_epochs}"] + extra, timeout=1800)
        found[mode] = metrics["test_accuracy"]
    return found


if __name__ == "__main__":
    app.run(main)
