"""Benchmark: switching modes within a run against staying in one mode, with and without a
straggler.

    python -m benchmarks.bench_switch [--np=4] [--epochs=12] [--repeats=2]

Every run is ``horovodrun -np 4 python scripts/train.py`` on digits (``--eval_each_epoch``:
the chief measures its model's test accuracy at each epoch's end). Three conditions:

  none        no straggler;
  slow        rank 1 4x slow throughout (``--sync_slow_worker=1:4.0``);
  transient   rank 1 4x slow during the middle third (``--sync_slow_worker=1:4.0@33.3%-66.7%``);

and four variants in each: sync; hybrid (groups of 2); the best fixed schedule for the
transient straggler (``sync:33.3%,hybrid:33.4%,sync``: hybrid exactly while it is slow); and
``--sync_switch_policy=straggler`` (sync, moving to hybrid while a straggler is seen). Measured:
training time, final test accuracy, and the time until the chief's model first reaches sync's
final accuracy in the same condition less 0.5 point (at an epoch's end). Targets: transient ->
policy's time to that accuracy <= 0.6 of sync's training time; none -> policy's training time
<= 1.05 of sync's. Runs are interleaved (every variant once per round) so that load on a
shared machine spreads over all of them; medians and ranges over the rounds.

Results go to docs/bench_switch.json and the ``switch`` section of docs/BENCHMARKS.md.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

from absl import app, flags

from benchmarks.benchlib import DOCS, REPO, TRAIN, replace_section, repo_env

flags.DEFINE_integer("np", 4, "Horovod ranks.")
flags.DEFINE_integer("epochs", 12, "Epochs of every run.")
flags.DEFINE_integer("repeats", 2, "Rounds (every variant of every condition once per round).")
flags.DEFINE_list("conditions", ["none", "slow", "transient"], "Conditions to run.")
flags.DEFINE_list("variants", ["sync", "hybrid", "schedule", "policy"], "Variants to run.")
flags.DEFINE_list("train_flags", [], "More scripts/train.py flags for every run.")
flags.DEFINE_float("timeout", 900.0, "Seconds one job may take before it is killed.")
flags.DEFINE_string("docs_dir", DOCS, "Where bench_switch.json and BENCHMARKS.md go.")
flags.DEFINE_bool("write_docs", True, "Write the table into --docs_dir/BENCHMARKS.md.")
flags.DEFINE_bool("report_only", False, "Rebuild the table from --docs_dir/bench_switch.json, running nothing.")
FLAGS = flags.FLAGS

CONDITIONS = {"none": [], "slow": ["--sync_slow_worker=1:4.0"], "transient": ["--sync_slow_worker=1:4.0@33.3%-66.7%"]}
VARIANTS = {
    "sync": ["--sync_mode=sync"],
    "hybrid": ["--sync_mode=hybrid", "--sync_group_size=2"],
    "schedule": ["--sync_mode=sync", "--sync_mode_schedule=sync:33.3%,hybrid:33.4%,sync", "--sync_group_size=2"],
    "policy": ["--sync_mode=sync", "--sync_switch_policy=straggler", "--sync_group_size=2", "--verbosity=1"],
}
POINTS = 0.005  # "within 0.5 point"


def run_one(condition: str, variant: str, work: str, number: int) -> dict:
    from tfsync_testbed import localrun

    tag = f"{condition}-{variant}-{number}"
    metrics = os.path.join(work, tag + ".json")
    command = [sys.executable, TRAIN, f"--epochs={FLAGS.epochs}",
               "--eval_each_epoch", f"--metrics_file={metrics}", f"--model_dir={os.path.join(work, tag)}",
               *VARIANTS[variant], *CONDITIONS[condition], *FLAGS.train_flags]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFSYNC_", "HOROVOD_"))}
    env = repo_env(env, TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    started = time.perf_counter()
    result = localrun.run(localrun.horovodrun_command(FLAGS.np, command), timeout=FLAGS.timeout, env=env, cwd=REPO)
    wall = time.perf_counter() - started
    if result.returncode != 0 or not os.path.exists(metrics):
        print(f"{tag}: failed with status {result.returncode}\n{result.stderr[-3000:]}", file=sys.stderr, flush=True)
        return {"condition": condition, "variant": variant, "failed": result.returncode}
    with open(metrics, encoding="utf-8") as handle:
        out = json.load(handle)
    out.update(condition=condition, variant=variant, job_seconds=round(wall, 1),
               switches=[line.split("switch policy: ", 1)[1][:160] for line in result.stderr.splitlines()
                         if "switch policy:" in line and "switch to" in line])
    print(f"{tag}: {out['train_seconds']:.1f}s accuracy {out['test_accuracy']:.4f} "
          f"switches {len(out['switches'])}", flush=True)
    return out


def time_to(run: dict, accuracy: float):
    """Seconds until the chief's model first reached `accuracy` at an epoch's end (None: never)."""
    for seconds, value in zip(run.get("epoch_seconds", []), run.get("epoch_accuracy", [])):
        if value >= accuracy:
            return seconds
    return None


def summarise(runs: list) -> dict:
    table = {}
    for condition in FLAGS.conditions:
        done = [r for r in runs if r["condition"] == condition and "failed" not in r]
        syncs = [r for r in done if r["variant"] == "sync"]
        if not syncs:
            continue
        sync_accuracy = statistics.median(r["test_accuracy"] for r in syncs)
        sync_seconds = statistics.median(r["train_seconds"] for r in syncs)
        target = sync_accuracy - POINTS
        for variant in FLAGS.variants:
            mine = [r for r in done if r["variant"] == variant]
            if not mine:
                continue
            reach = [time_to(r, target) for r in mine]
            table[f"{condition}/{variant}"] = {
                "train_seconds": [r["train_seconds"] for r in mine],
                "test_accuracy": [r["test_accuracy"] for r in mine],
                "seconds_to_target": reach, "target_accuracy": round(target, 4),
                "sync_train_seconds_median": sync_seconds,
                "time_ratio": [round(r["train_seconds"] / sync_seconds, 3) for r in mine],
                "to_target_ratio": [round(s / sync_seconds, 3) if s is not None else None for s in reach],
                "switches": [r.get("switches", []) for r in mine],
            }
    return table


def spread(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "never"
    if len(values) == 1:
        return f"{values[0]:.3g}"
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def hybrid_defaults() -> str:
    """The hybrid knobs the runs used: the shipped defaults at the time of the run."""
    from tfsyncmodes import config as config_lib

    c = config_lib.resolve({"mode": "hybrid"}, environ={}, use_flags=False)
    compression = f"topk {c.topk_ratio:g}" if c.compression == "topk" else c.compression
    every = f"staleness {c.staleness}" if c.cross_group == "stale" else f"period {c.period}"
    return f"cross_group={c.cross_group}, {every}, compression {compression}, local_steps {c.local_steps}"


def report(table: dict, rounds: int, epochs: int) -> str:
    lines = [
        "## Switching within a run: mode schedule and straggler policy",
        "",
        f"`python -m benchmarks.bench_switch` — horovodrun -np {FLAGS.np} on one 2-core host shared with other "
        f"jobs (timings are noisy), scripts/train.py on digits, {epochs} epochs of 22 steps, global batch "
        f"64, Adam, one intra-op thread per rank; hybrid: groups of 2, {hybrid_defaults()}; policy: threshold "
        "1.5, every 10 steps, patience 2. "
        f"{rounds} complete round(s) (every variant once per round; runs of an unfinished round are "
        "included); median (range).",
        "",
        "| condition | variant | training s | accuracy | s to sync's accuracy - 0.5 pt | time / sync's | to target / sync's time | switches (first run) |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for key, row in table.items():
        condition, variant = key.split("/")
        switches = "; ".join(s.split(":")[0] + ":" + s.split(":")[1] for s in row["switches"][0]) if row["switches"] else ""
        lines.append(f"| {condition} | {variant} | {spread(row['train_seconds'])} | {spread(row['test_accuracy'])} | "
                     f"{spread(row['seconds_to_target'])} | {spread(row['time_ratio'])} | "
                     f"{spread(row['to_target_ratio'])} | {switches or '-'} |")
    lines += ["", "Targets:", ""]
    transient = table.get("transient/policy")
    if transient:
        ratios = [r for r in transient["to_target_ratio"] if r is not None]
        value = statistics.median(ratios) if ratios else None
        verdict = "holds" if value is not None and value <= 0.6 else "does not hold"
        lines.append(f"- transient straggler: policy's time to sync's final accuracy (within 0.5 point) over "
                     f"sync's training time: **{spread(transient['to_target_ratio'])}**, target <= 0.6: {verdict}")
    even = table.get("none/policy")
    if even:
        value = statistics.median(even["time_ratio"])
        verdict = "holds" if value <= 1.05 else "does not hold"
        lines.append(f"- no straggler: policy's training time over sync's: **{spread(even['time_ratio'])}**, "
                     f"target <= 1.05: {verdict}")
    lines += ["", READING]
    return "\n".join(lines)


READING = (
    "How to read it: training s is the chief's time in `fit` (start-up excluded); accuracy is the chief's "
    "model on the held-out fifth of digits at the end (in hybrid the groups are averaged at the end); the "
    "time to the target is taken at epoch ends, so it is a multiple of an epoch's time, and in hybrid it is "
    "the chief's group's model. Every rank runs the same number of steps, so a run that ends in sync (sync, "
    "the schedule, the policy) still waits for the slow rank's steps: hybrid only lets the fast group's "
    "model train ahead while the straggler lasts (up to the staleness bound, and up to the policy's "
    "every-window exchange of step times), it does not shorten the slow rank's own work. Each switch "
    "traces the train function again (Keras `make_train_function(force=True)`), which on this loaded "
    "machine costs about as much as the first epoch's trace (several seconds, against 1-3 s per later "
    "epoch); that, not the policy's measuring, is most of what switching costs here. In the slow "
    "condition `--sync_slow_worker` also multiplies the first step, trace included, by 4 (the slow rank "
    "sleeps three times the trace), which every variant pays in its first epoch; the same happens at a switch inside the straggler's "
    "window (the first step after it traces again, and the slow rank sleeps three times that), which is "
    "most of the transient policy's and schedule's extra time here. Recorded with one round only (time allowed no more); a multi-process test job shared the cores "
    "with the no-straggler runs of policy and schedule, so read differences under about 30 % as noise. "
    "`switches` lists the "
    "policy's switches as its chief logged them (the schedule's are at 33.3 % and 66.7 % of the steps).")


def save(runs: list, rounds: int) -> None:
    """The raw runs so far and the table from them, after every run (a stopped benchmark keeps
    what it measured)."""
    os.makedirs(FLAGS.docs_dir, exist_ok=True)
    with open(os.path.join(FLAGS.docs_dir, "bench_switch.json"), "w", encoding="utf-8") as handle:
        json.dump({"np": FLAGS.np, "epochs": FLAGS.epochs, "rounds": rounds, "table": summarise(runs),
                   "runs": runs,
                   "note": "one 2-core machine shared with other jobs while this ran: timings are noisy"},
                  handle, indent=1)


def main(argv):
    del argv
    path = os.path.join(FLAGS.docs_dir, "bench_switch.json")
    if FLAGS.report_only:
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
        runs, rounds, epochs = saved["runs"], saved["rounds"], saved["epochs"]
    else:
        runs, rounds, epochs = [], 0, FLAGS.epochs
        with tempfile.TemporaryDirectory() as work:
            for number in range(FLAGS.repeats):
                for condition in FLAGS.conditions:
                    for variant in FLAGS.variants:
                        run = run_one(condition, variant, work, number)
                        runs.append({k: v for k, v in run.items() if k not in ("losses",)})
                        save(runs, rounds)
                rounds += 1
                save(runs, rounds)
    text = report(summarise(runs), rounds, epochs)
    print(text)
    if FLAGS.write_docs:
        replace_section(os.path.join(FLAGS.docs_dir, "BENCHMARKS.md"), "switch", text)


if __name__ == "__main__":
    app.run(main)
