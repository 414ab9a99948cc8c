"""Scaling on the emulated cluster bed: each mode's throughput and time to sync's loss targets
against the ranks (2, 4, 8), per link class, under one straggler condition (heavy-tailed delays
by default), as a table and a PNG plot, read from the bed's JSON files.

    python -m benchmarks.bed_scaling docs/bed_2r_10gbit_stragglers.json ... \
        --straggler=heavy --constants=docs/bed_model.json

For every link x ranks x mode the row comes from the last file given that has it, so a file
measured later with the shipped defaults overrides an older one; the table names each row's file.
Throughput is the steady rate (after the first epoch) as a share of the compute-only rate: the
bed's global batch over one rank's mean emulated step (every rank's part of a step waits
``emulated_step_ms``, the heavy tail's factors have mean 1, at every N), so 1.0 is a cluster
that never waits for the network or a peer. Time to target is each run's seconds to sync's 1/4,
1/2, 3/4 loss drop over the same repeat's sync run's (the bed's ``ratio_to_sync_runs``).
``--constants`` (the cost model's fit, ``bed_model.json``) adds the model's figure for each row.
Writes ``bed_scaling.json``, ``bed_scaling.png`` and the ``bed_scaling`` section of
BENCHMARKS.md in ``--docs_dir``.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from typing import List, Optional

from absl import app, flags

from benchmarks import bed_calibration as cal
from benchmarks.bed_rows import DEFAULT, BadInput, Settings, emulated, load, measured, predict
from benchmarks.benchlib import DOCS, replace_section

FLAGS = flags.FLAGS
NAME = "benchmarks.bed_scaling"
TARGETS = ("0.25", "0.5", "0.75")
MODE_ORDER = ("sync", "hybrid", "async", "policy", "auto")


def constants_of(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            fit = json.load(handle)["fit"]
        return {key: fit[key] for key in ("alpha_s", "overhead_s", "efficiency", "hybrid_s", "policy_s")}
    except OSError as error:
        raise BadInput(f"--constants: {path} cannot be read ({error.strerror}); give the cost model's "
                       "docs/bed_model.json")
    except (ValueError, KeyError, TypeError):
        raise BadInput(f"--constants: {path} has no fitted constants; give the bed_model.json that "
                       "python -m benchmarks.bed_model writes")


def spread(values: list) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def share(rate: Optional[float], bed: dict, settings: Settings) -> Optional[float]:
    """A rate over the compute-only rate: the global batch every emulated step."""
    return None if rate is None else rate * bed["emulated_step_ms"] / 1000 / settings.batch_size


def rows_of(paths: List[str], straggler: str, constants: Optional[dict], settings: Settings = DEFAULT) -> List[dict]:
    """The table: one row per link x ranks x mode, from the last file that has it."""
    if straggler not in cal.STRAGGLERS:
        raise BadInput(f"--straggler: {straggler!r} is not a condition; use one of {', '.join(cal.STRAGGLERS)}")
    chosen = {}
    for path in paths:
        bed = load(path)
        if not emulated(bed):
            continue  # real compute: a sanity check, not on the emulated clock
        for row in bed["rows"]:
            if row["straggler"] == straggler:
                chosen[(bed["link"], bed["ranks"], row["mode"])] = (os.path.basename(path), bed, row)
    if not chosen:
        raise BadInput(f"no input has an emulated {straggler!r} row; give bed JSONs run with --straggler={straggler}")
    out = []
    links = sorted({k[0] for k in chosen}, key=lambda link: list(cal.LINK_CLASSES).index(link))
    for link in links:
        for ranks in sorted({k[1] for k in chosen if k[0] == link}):
            for mode in sorted({k[2] for k in chosen if k[:2] == (link, ranks)}, key=order):
                name, bed, row = chosen[(link, ranks, mode)]
                runs = row.get("steady_samples_per_s_runs") or [measured(row)]
                ratios = row.get("ratio_to_sync_runs") or {}
                predicted = None
                if constants is not None:
                    predicted = predict(bed, mode, straggler, constants["alpha_s"], constants["overhead_s"], settings,
                                        constants.get("hybrid_s") or 0.0, constants.get("efficiency", 1.0),
                                        constants.get("policy_s") or 0.0)
                out.append({"link": link, "ranks": ranks, "mode": mode, "file": name,
                            "step_ms": bed["emulated_step_ms"], "samples_per_s": measured(row),
                            "share": spread([share(r, bed, settings) for r in runs]),
                            "predicted_share": share(predicted, bed, settings),
                            "ratio_to_sync": {t: spread(ratios.get(t, [])) for t in TARGETS},
                            "test_accuracy": spread(row.get("test_accuracy_runs") or [row.get("test_accuracy")])})
    return out


def order(mode: str) -> int:
    return MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER)


def cell(s: dict, digits: int = 2) -> str:
    if s["median"] is None:
        return "-"
    text = f"{s['median']:.{digits}f}"
    return text if s["min"] == s["max"] else f"{text} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def render(rows: List[dict], straggler: str, paths: List[str], constants_path: Optional[str]) -> str:
    command = (f"python -m benchmarks.bed_scaling {' '.join(os.path.basename(p) for p in paths)} --straggler={straggler}"
               + (f" --constants={os.path.basename(constants_path)}" if constants_path else ""))
    lines = [f"## Scaling on the bed: {straggler} straggler condition, N = "
             + ", ".join(str(n) for n in sorted({r['ranks'] for r in rows})), "",
             f"`{command}` — each link x ranks x mode from the last file given that has it (named in the "
             "table). Share of compute-only: the steady rate over the bed's global batch per emulated step "
             "(1.0 = never waiting for the network or a peer), median (range) over the repeats; the model's "
             "figure from the cost model's fitted constants. Time to target: seconds to sync's 1/4, 1/2, 3/4 "
             "loss drop over the same repeat's sync run's. Plot: `docs/bed_scaling.png`.", "",
             "| link | ranks | mode | share of compute-only | model | ratio to sync's time: 1/4 | 1/2 | 3/4 "
             "| test accuracy | file |",
             "|---|---:|---|---|---:|---|---|---|---|---|"]
    for r in rows:
        model = "-" if r["predicted_share"] is None else f"{r['predicted_share']:.2f}"
        ratio = [cell(r["ratio_to_sync"][t]) if r["mode"] != "sync" else "1" for t in TARGETS]
        lines.append(f"| {r['link']} | {r['ranks']} | {r['mode']} | {cell(r['share'])} | {model} | "
                     + " | ".join(ratio) + f" | {cell(r['test_accuracy'], 3)} | {r['file']} |")
    return "\n".join(lines) + "\n"


def plot(rows: List[dict], straggler: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    links = list(dict.fromkeys(r["link"] for r in rows))
    figure, axes = plt.subplots(2, len(links), figsize=(4.5 * len(links), 7), squeeze=False)
    for column, link in enumerate(links):
        top, bottom = axes[0][column], axes[1][column]
        for mode in sorted({r["mode"] for r in rows if r["link"] == link}, key=order):
            mine = [r for r in rows if r["link"] == link and r["mode"] == mode]
            ranks = [r["ranks"] for r in mine]
            color = f"C{order(mode)}"  # a mode's colour the same in every panel
            errorbar(top, ranks, [r["share"] for r in mine], mode, color)
            model = [(r["ranks"], r["predicted_share"]) for r in mine if r["predicted_share"] is not None]
            if model:
                top.plot(*zip(*model), linestyle=":", color=color, label=f"{mode} (model)")
            if mode != "sync":
                errorbar(bottom, ranks, [r["ratio_to_sync"]["0.75"] for r in mine], mode, color)
        top.set_title(f"{link} link, {straggler} straggler")
        top.set_ylabel("share of the compute-only rate")
        top.set_ylim(0, 1.05)
        bottom.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="sync")
        bottom.set_ylabel("time to sync's 3/4 loss target / sync's")
        for axis in (top, bottom):
            axis.set_xscale("log", base=2)
            axis.set_xticks(sorted({r["ranks"] for r in rows}))
            axis.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            axis.set_xlabel("ranks")
            axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def errorbar(axis, ranks: list, spreads: list, label: str, color: str) -> None:
    kept = [(n, s) for n, s in zip(ranks, spreads) if s["median"] is not None]
    if kept:
        middle = [s["median"] for _, s in kept]
        errors = [[s["median"] - s["min"] for _, s in kept], [s["max"] - s["median"] for _, s in kept]]
        axis.errorbar([n for n, _ in kept], middle, yerr=errors, marker="o", capsize=4, label=label, color=color)


def run(paths: List[str], straggler: str, constants_path: Optional[str], docs_dir: str,
        settings: Settings = DEFAULT) -> str:
    if not paths:
        raise BadInput("no bed JSON given; e.g. python -m benchmarks.bed_scaling docs/bed_8r_10gbit.json")
    constants = constants_of(constants_path) if constants_path else None
    rows = rows_of(paths, straggler, constants, settings)
    text = render(rows, straggler, paths, constants_path)
    os.makedirs(docs_dir, exist_ok=True)
    with open(os.path.join(docs_dir, "bed_scaling.json"), "w", encoding="utf-8") as handle:
        json.dump({"inputs": [os.path.basename(p) for p in paths], "straggler": straggler, "rows": rows}, handle, indent=1)
    plot(rows, straggler, os.path.join(docs_dir, "bed_scaling.png"))
    replace_section(os.path.join(docs_dir, "BENCHMARKS.md"), "bed_scaling", text)
    return text


def main(argv):
    try:
        print(run(argv[1:], FLAGS.straggler, FLAGS.constants, FLAGS.docs_dir), end="")
    except BadInput as error:
        sys.stderr.write(f"{NAME}: error: {error}\n")
        sys.exit(2)


def define_flags() -> None:
    """The command's flags, defined only when it runs (tests import this module beside other
    benchmarks that define ``--docs_dir`` too)."""
    flags.DEFINE_string("straggler", "heavy", "The condition whose rows are compared: " + ", ".join(cal.STRAGGLERS) + ".")
    flags.DEFINE_string("constants", None, "The cost model's bed_model.json: its fitted constants price every row too.")
    flags.DEFINE_string("docs_dir", DOCS, "Where bed_scaling.json, bed_scaling.png and BENCHMARKS.md go.")


if __name__ == "__main__":
    define_flags()
    app.run(main)
