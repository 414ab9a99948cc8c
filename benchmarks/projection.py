"""Projection: each mode's throughput from the cost model (:mod:`tfsyncmodes.costs`) at 16 to 1024
ranks on 1, 10 and 100 Gbit/s links, with no straggler, one rank persistently slow, and a
heavy-tailed per-step delay, for one named workload.

    python -m benchmarks.projection [--ranks=16,64,256,1024] [--links=1,10,100] [--step_ms=...]

Nothing runs but the model (seconds, one process). It writes docs/projection.json,
docs/projection.png (throughput against ranks, one panel per straggler condition, at each
link) and the ``projection`` section of docs/BENCHMARKS.md: for each condition and link, the
predicted samples per second of sync, async and hybrid, which mode is highest and by how much.
The model predicts throughput, not samples to an accuracy: hybrid and async usually need more
samples than sync for the same accuracy (the ``auto`` mode asks hybrid for 1.25x sync's rate
before it picks it). How close the model comes to measured runs: the ``bed_model`` section
(benchmarks/bed_model.py).
"""
from __future__ import annotations

import json
import os

from absl import app, flags

from benchmarks.bed_calibration import REAL_GRADIENT_BYTES, REAL_STEP_SECONDS
from benchmarks.benchlib import DOCS, replace_section
from tfsyncmodes import costs, simulate

flags.DEFINE_list("ranks", ["16", "64", "256", "1024"], "Ranks (a multiple of --ranks_per_host).")
flags.DEFINE_list("links", ["1", "10", "100"], "Links between hosts, Gbit/s.")
flags.DEFINE_integer("ranks_per_host", 8, "Ranks (accelerators) per host: hybrid's groups.")
flags.DEFINE_float("host_gbit", 1200.0, "The link inside a host, Gbit/s (NVLink-class by default).")
flags.DEFINE_float("step_ms", round(REAL_STEP_SECONDS * 1e3, 1), "Median compute time of one step on one rank.")
flags.DEFINE_float("grad_mb", round(REAL_GRADIENT_BYTES / 1e6, 1), "Gradient size, MB.")
flags.DEFINE_integer("batch", 256, "Samples per rank and step.")
flags.DEFINE_string("workload", "ResNet-50 v1.5 on V100s (201.6 ms a step at batch 256, 102.2 MB of float32 "
                    "gradients; the bed's calibration, benchmarks/bed_calibration.py)",
                    "The workload's name, for the report.")
flags.DEFINE_float("straggler", 4.0, "The persistent straggler's factor.")
flags.DEFINE_float("tail_sigma", 0.5, "Lognormal shape of the heavy-tailed per-step delay (our choice: "
                   "no published fit was found; see bed_calibration).")
flags.DEFINE_integer("period", 8, "Hybrid's inner steps per round.")
flags.DEFINE_integer("ps", 0, "Async's parameter servers (0: one per host).")
flags.DEFINE_string("docs_dir", DOCS, "Where projection.json, projection.png and BENCHMARKS.md go.")
FLAGS = flags.FLAGS

CONDITIONS = ("none", "persistent", "tail")


def job(ranks: int, link: float, condition: str) -> costs.Job:
    return costs.Job(ranks=ranks, step_ms=FLAGS.step_ms, grad_mb=FLAGS.grad_mb, link_gbit=link,
                     ranks_per_host=FLAGS.ranks_per_host, host_gbit=FLAGS.host_gbit, batch=FLAGS.batch,
                     straggler=FLAGS.straggler if condition == "persistent" else 1.0,
                     tail_sigma=FLAGS.tail_sigma if condition == "tail" else 0.0, period=FLAGS.period,
                     local_steps="auto", ps=FLAGS.ps or max(ranks // FLAGS.ranks_per_host, 1))


def project() -> list:
    rows = []
    for condition in CONDITIONS:
        for link in map(float, FLAGS.links):
            for ranks in map(int, FLAGS.ranks):
                predicted = simulate.predict(job(ranks, link, condition))
                rows.append({"condition": condition, "link_gbit": link, "ranks": ranks,
                             "samples_per_s": {m: round(v, 1) for m, v in predicted.items()}})
    return rows


def report(rows: list) -> str:
    lines = [f"Predicted by the cost model for {FLAGS.workload}, {FLAGS.ranks_per_host} ranks a host "
             f"({FLAGS.host_gbit:g} Gbit/s inside a host), hybrid one group per host, period {FLAGS.period}, "
             "speed-proportional local steps; async one parameter server per host. Conditions: none; "
             f"persistent (one rank {FLAGS.straggler:g}x slow); tail (every rank's step times a lognormal delay "
             f"of mean 1 and shape {FLAGS.tail_sigma:g}). Command: `python -m benchmarks.projection`. Throughput "
             "only: hybrid and async need more samples than sync for the same accuracy.", "",
             "| condition | link | ranks | sync samples/s | async samples/s | hybrid samples/s | highest | over sync |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        rates = row["samples_per_s"]
        top = costs.best(rates)
        lines.append(f"| {row['condition']} | {row['link_gbit']:g} Gbit/s | {row['ranks']} | "
                     + " | ".join(f"{rates[m]:,.0f}" for m in costs.MODES)
                     + f" | {top} | {rates[top] / rates['sync']:.2f} |")
    lines += ["", "![Predicted throughput against ranks](projection.png)"]
    return "\n".join(lines)


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    links = list(map(float, FLAGS.links))
    figure, axes = plt.subplots(len(links), len(CONDITIONS), figsize=(4 * len(CONDITIONS), 3 * len(links)),
                                squeeze=False, sharex=True)
    for i, link in enumerate(links):
        for j, condition in enumerate(CONDITIONS):
            ax = axes[i][j]
            chosen = [r for r in rows if r["condition"] == condition and r["link_gbit"] == link]
            for mode in costs.MODES:
                ax.plot([r["ranks"] for r in chosen], [r["samples_per_s"][mode] for r in chosen], marker="o",
                        label=mode)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{condition}, {link:g} Gbit/s", fontsize=9)
            if i == len(links) - 1:
                ax.set_xlabel("ranks")
            if j == 0:
                ax.set_ylabel("samples/s")
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main(argv) -> None:
    del argv
    rows = project()
    os.makedirs(FLAGS.docs_dir, exist_ok=True)
    with open(os.path.join(FLAGS.docs_dir, "projection.json"), "w", encoding="utf-8") as handle:
        json.dump({"workload": FLAGS.workload, "flags": {k: getattr(FLAGS, k) for k in (
            "ranks_per_host", "host_gbit", "step_ms", "grad_mb", "batch", "straggler", "tail_sigma", "period")},
            "rows": rows}, handle, indent=1)
    plot(rows, os.path.join(FLAGS.docs_dir, "projection.png"))
    text = report(rows)
    replace_section(os.path.join(FLAGS.docs_dir, "BENCHMARKS.md"), "projection", text)
    print(text)


if __name__ == "__main__":
    app.run(main)
