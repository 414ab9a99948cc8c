"""Where compressed sync pays: dense allreduce against Top-K allgather at several densities (and
int8) on the emulated cluster bed, and the density below which Top-K is faster, against the 1/N
estimate.

    python -m benchmarks.breakeven --ranks=4 --link=1gbit --ratios=0.5,0.25,0.1,0.01 --repeats=3

One bed run (:mod:`benchmarks.bed`, ``--modes=sync --straggler=none``) per configuration: dense
(``--sync_compression=none``), ``topk`` at each ``--ratios`` (``--sync_topk_ratio``) and ``int8``.
The estimate: a ring allreduce puts 2 (N-1)/N B through each rank's link, a Top-K allgather of
values and int32 indices (N-1) 2 r B, so Top-K moves fewer bytes below r = 1/N. Each
configuration's steady samples/s (median and runs) and its ratio to dense's; JSON
docs/breakeven_<ranks>r_<link>.json and a section of docs/BENCHMARKS.md.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile

from absl import app, flags

from benchmarks.benchlib import DOCS, REPO, bad_flag, check_bed_counts, module_command, replace_section, repo_env

flags.DEFINE_integer("ranks", 4, "Horovod ranks: 2, 4 or 8.")
flags.DEFINE_string("link", "1gbit", "The bed's link class.")
flags.DEFINE_list("ratios", ["0.5", "0.25", "0.1", "0.01"], "Top-K ratios (--sync_topk_ratio).")
flags.DEFINE_integer("repeats", 3, "Runs of every configuration.")
flags.DEFINE_integer("epochs", 2, "Epochs of every run.")
flags.DEFINE_float("step_ms", None, "A rank's emulated compute a step, ms, passed to the bed (its links slow "
                   "with it); unset: the bed's default. 200 for 8 ranks on 2 cores.")
flags.DEFINE_string("docs_dir", DOCS, "Where the JSON and BENCHMARKS.md go.")
FLAGS = flags.FLAGS


def check() -> None:
    check_bed_counts("benchmarks.breakeven", FLAGS)
    for ratio in FLAGS.ratios:
        try:
            value = float(ratio)
        except ValueError:
            value = -1.0
        if not 0 < value <= 1:
            bad_flag("benchmarks.breakeven", "ratios", f"{ratio!r} is not a ratio",
                     "use numbers in (0, 1], e.g. 0.5,0.1,0.01")
    if FLAGS.step_ms is not None and not (math.isfinite(FLAGS.step_ms) and FLAGS.step_ms >= 1):
        bad_flag("benchmarks.breakeven", "step_ms", f"{FLAGS.step_ms:g} is not accepted",
                 "use milliseconds >= 1, e.g. 200 for 8 ranks on 2 cores")


def step_flags() -> list:
    """The bed's ``--step_ms`` where one was given."""
    return [] if FLAGS.step_ms is None else [f"--step_ms={FLAGS.step_ms:g}"]


def configurations() -> list:
    out = [("dense", "--sync_compression=none")]
    out += [(f"topk {r}", f"--sync_compression=topk --sync_topk_ratio={r}") for r in FLAGS.ratios]
    return out + [("int8", "--sync_compression=int8")]


def bed_row(label: str, extra: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        command = module_command("benchmarks.bed", f"--ranks={FLAGS.ranks}", f"--link={FLAGS.link}",
                                 "--straggler=none", "--modes=sync", f"--repeats={FLAGS.repeats}",
                                 f"--epochs={FLAGS.epochs}", *step_flags(), f"--docs_dir={out}",
                                 f"--extra_flags={extra}")
        result = subprocess.run(command, env=repo_env(), cwd=REPO, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            sys.stderr.write(result.stderr[-4000:])
            sys.exit(f"benchmarks.breakeven: the bed run of {label} failed with status {result.returncode}")
        with open(os.path.join(out, f"bed_{FLAGS.ranks}r_{FLAGS.link}.json"), encoding="utf-8") as handle:
            bed = json.load(handle)
    (row,) = bed["rows"]
    print(f"[breakeven] {label}: {row['steady_samples_per_s']} samples/s {row['steady_samples_per_s_runs']}", flush=True)
    return {"label": label, "flags": extra, "steady_samples_per_s": row["steady_samples_per_s"],
            "runs": row["steady_samples_per_s_runs"], "test_accuracy_runs": row["test_accuracy_runs"],
            "measured_mbit_s": bed["measured_mbit_s"]}


def main(argv):
    del argv
    check()
    rows = [bed_row(label, extra) for label, extra in configurations()]
    dense = rows[0]["steady_samples_per_s"]
    for row in rows:
        row["ratio_to_dense"] = round(row["steady_samples_per_s"] / dense, 3)
    faster = [float(r["label"].split()[1]) for r in rows if r["label"].startswith("topk") and r["ratio_to_dense"] > 1]
    result = {"ranks": FLAGS.ranks, "link": FLAGS.link, "epochs": FLAGS.epochs, "repeats": FLAGS.repeats,
              "step_ms": FLAGS.step_ms, "estimate_ratio": round(1 / FLAGS.ranks, 4),
              "largest_ratio_faster": max(faster) if faster else None, "rows": rows}
    name = f"breakeven_{FLAGS.ranks}r_{FLAGS.link}"
    with open(os.path.join(FLAGS.docs_dir, name + ".json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    lines = [f"## Where compressed sync pays: {FLAGS.ranks} ranks, link {FLAGS.link}", "",
             f"`python -m benchmarks.breakeven --ranks={FLAGS.ranks} --link={FLAGS.link} "
             f"--ratios={','.join(FLAGS.ratios)} --repeats={FLAGS.repeats} --epochs={FLAGS.epochs}"
             f"{''.join(' ' + f for f in step_flags())}` — one bed run "
             "(sync, no straggler) per configuration; steady samples/s (after the first epoch), median and runs. "
             f"Estimate: Top-K's allgather moves fewer bytes than the ring below a ratio of 1/N = {1 / FLAGS.ranks:g}; "
             f"measured: Top-K faster than dense up to a ratio of {result['largest_ratio_faster']}.", "",
             "| configuration | steady samples/s (runs) | / dense | test accuracy (runs) |", "|---|---|---:|---|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['steady_samples_per_s']:.0f} ({', '.join(f'{v:.0f}' for v in r['runs'])}) | "
                     f"{r['ratio_to_dense']:.2f} | {', '.join(f'{v:.3f}' for v in r['test_accuracy_runs'])} |")
    replace_section(os.path.join(FLAGS.docs_dir, "BENCHMARKS.md"), name, "\n".join(lines) + "\n")


if __name__ == "__main__":
    app.run(main)
