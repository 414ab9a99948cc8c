"""Goodput and recovery time under repeated failures, per mode against the failure interval.

    python -m benchmarks.chaos --modes=sync,async --interval=20,30,60 --repeats=3

Each run is a 4-rank job (:mod:`benchmarks.chaos_driver`) that loses a random non-chief process
every I seconds (uniform in [I(1-s), I(1+s)], s = ``--spread``, seeded by the run) and gets it
back; what goodput and recovery time are is in :mod:`benchmarks.chaoslib`. The table gives, per
mode and interval, the median and the range over ``--repeats`` runs; ``--out`` the JSON (every
run's figures), ``--plot`` the PNG (goodput against the interval, one line per mode, the range
as error bars); ``--report_only a.json,b.json`` prints the table of earlier runs and plots them
together (e.g. one mode's runs taken apart from another's)."""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from statistics import median

from benchmarks import chaos_driver, chaoslib
from benchmarks.chaos_worker import digits

GOAL = 0.8  # goodput with a failure every 30 s


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--interval", default="20,30,60", help="seconds between failures, comma-separated")
    parser.add_argument("--spread", type=float, default=0.25)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--steps_per_epoch", type=int, default=100)
    parser.add_argument("--step_ms", type=float, default=100.0, help="emulated compute per step")
    parser.add_argument("--commit", type=int, default=10, help="sync: commit every N steps")
    parser.add_argument("--collective_timeout", type=float, default=5,
                        help="sync: --sync_collective_timeout, the seconds a lost rank is waited for")
    parser.add_argument("--warm", action="store_true",
                        help="sync, hybrid: the ranks start through python -m tfsyncmodes_warm (warm joins)")
    parser.add_argument("--baseline", action="store_true", help="also undisturbed runs (interval 'none')")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--knobs", default="", help="KEY=VALUE,...: knobs for the job (TFSYNC_KEY)")
    parser.add_argument("--report_only", default="",
                        help="comma-separated JSON files of earlier runs: print their table and plot them together")
    parser.add_argument("--out", default="chaos.json")
    parser.add_argument("--plot", default="chaos.png")
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    for mode in args.modes:
        if mode not in chaoslib.MODES:
            parser.error(f"--modes: {mode!r}: chaos runs exist for {', '.join(chaoslib.MODES)}")
    args.intervals = [float(i) for i in args.interval.split(",") if i]
    knob_settings(args.knobs)  # bad input stops here, before any run
    return args


def accuracy(final):
    if final is None:
        return None
    _, _, x, y = digits()
    return float(((x @ final["kernel"] + final["bias"]).argmax(axis=1) == y).mean())


def knob_settings(text: str) -> dict:
    """{key: value} of ``KEY=VALUE,...``; anything else is one line and exit status 2."""
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    if any(len(pair) != 2 or not pair[0] for pair in pairs):
        sys.stderr.write(f"chaos: error: flag: --knobs: {text!r} is not KEY=VALUE,...; "
                         "e.g. --knobs=exactly_once=true\n")
        sys.exit(2)
    return dict(pairs)


def one_run(args, mode, interval, repeat):
    window = None if interval is None else (interval * (1 - args.spread), interval * (1 + args.spread))
    result = chaos_driver.run(mode, interval=window, seed=1000 * repeat + int(interval or 0),
                              epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                              step_ms=args.step_ms, commit=args.commit,
                              collective_timeout=args.collective_timeout, timeout=args.timeout,
                              warm=args.warm, knobs=knob_settings(args.knobs))
    final = result.get("final")
    row = {k: result.get(k) for k in ("mode", "seed", "status", "promised_steps", "counted", "rolled_back",
                                      "goodput", "pace", "train_seconds", "wall_seconds", "startup_seconds",
                                      "kills", "recoveries", "leftovers", "serve_seconds",
                                      "killed_before_serving")}
    if args.warm and mode != "async":
        row["mode"] = f"{mode}, warm joins"
    if args.knobs:
        row["mode"] = f"{row['mode']}, {args.knobs}"
    # Re-runs the chief found applied and skipped (--sync_exactly_once), from its log.
    row["skipped_reruns"] = sum(int(n) for n in re.findall(
        r"(\d+) step\(s\) (?:of this epoch )?had landed", result.get("output", "")))
    # TensorFlow's coordinator re-admitting lost workers: an attempt fails while any lost one
    # does not serve (it logs this line, retries, and the lost workers wait meanwhile).
    row["failed_readmissions"] = result.get("output", "").count("Cluster update failed with error")
    row.update(interval=interval, repeat=repeat, accuracy=accuracy(final),
               iterations=None if final is None else int(final["iterations"]),
               samples=None if final is None else int(final["samples"]))
    if result["status"] != 0:
        sys.stderr.write(result["output"][-3000:])
    return row


def spread_text(values, digits_=2):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{median(values):.{digits_}f} [{min(values):.{digits_}f}, {max(values):.{digits_}f}]"


def table(rows):
    lines = ["| mode | failure every (s) | runs | failures | goodput, median [range] | "
             "recovery (s), median [range] | counted / promised steps | test accuracy |",
             "|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["mode"], r["interval"] if r["interval"] is not None else float("inf")) for r in rows})
    for mode, interval in keys:
        group = [r for r in rows if r["mode"] == mode
                 and (r["interval"] if r["interval"] is not None else float("inf")) == interval]
        recoveries = [x for r in group for x in (r["recoveries"] or [])]
        counted = f"{min(r['counted'] or 0 for r in group)} / {group[0]['promised_steps']}"
        lines.append(f"| {mode} | {'none' if interval == float('inf') else f'{interval:g}'} | {len(group)} | "
                     f"{sum(len(r['kills']) for r in group)} | {spread_text([r['goodput'] for r in group])} | "
                     f"{spread_text(recoveries, 1)} | {counted} | {spread_text([r['accuracy'] for r in group], 4)} |")
    return "\n".join(lines)


def restart_table(rows):
    """Async's restarted workers: from start to serving, and the kills that hit a worker not
    serving yet (TensorFlow's coordinator takes lost workers back only once all of them serve)."""
    lines = ["| mode | failure every (s) | restarts that served | start to serving (s), median [range] | "
             "kills of a worker not serving yet | coordinator's failed re-admissions |", "|---|---|---|---|---|---|"]
    for mode, interval in sorted({(r["mode"], r["interval"]) for r in rows if r.get("serve_seconds") is not None}):
        group = [r for r in rows if r["mode"] == mode and r["interval"] == interval]
        serve = [x for r in group for x in r.get("serve_seconds") or []]
        every = "none" if interval is None else f"{interval:g}"
        lines.append(f"| {mode} | {every} | {len(serve)} | {spread_text(serve, 1)} | "
                     f"{sum(r.get('killed_before_serving') or 0 for r in group)} of "
                     f"{sum(len(r['kills']) for r in group)} | "
                     f"{spread_text([r.get('failed_readmissions') for r in group], 0)} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for mode in sorted({r["mode"] for r in rows}):
        intervals = sorted({r["interval"] for r in rows if r["mode"] == mode and r["interval"] is not None})
        values = [[r["goodput"] for r in rows if r["mode"] == mode and r["interval"] == i
                   and r["goodput"] is not None] or [float("nan")] for i in intervals]
        middle = [median(v) for v in values]
        errors = [[m - min(v) for m, v in zip(middle, values)], [max(v) - m for m, v in zip(middle, values)]]
        axes.errorbar(intervals, middle, yerr=errors, marker="o", capsize=4, label=mode)
    axes.axhline(GOAL, color="grey", linestyle="--", linewidth=1, label=f"goal {GOAL}")
    axes.set_xlabel("seconds between failures")
    axes.set_ylabel("goodput (median, range)")
    axes.set_ylim(0, 1.05)
    axes.set_title("4 ranks, a random non-chief process lost and back")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv=None):
    args = parse(argv)
    # A SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C: each run's job is stopped and removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.report_only:
        rows = []
        for path in args.report_only.split(","):
            with open(path, encoding="utf-8") as handle:
                rows += json.load(handle)["runs"]
        print(table(rows))
        print(restart_table(rows))
        plot(rows, args.plot)
        return 0
    rows = []
    intervals = ([None] if args.baseline else []) + args.intervals
    for mode in args.modes:
        for interval in intervals:
            for repeat in range(args.repeats):
                rows.append(one_run(args, mode, interval, repeat))
                last = rows[-1]
                print(f"{mode} every {interval} s, run {repeat + 1}: goodput {last['goodput']}, "
                      f"{len(last['kills'])} failures, status {last['status']}", file=sys.stderr, flush=True)
    print(table(rows))
    print(restart_table(rows))
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump({"settings": {k: v for k, v in vars(args).items() if k not in ("out", "plot")},
                   "runs": rows}, handle, indent=1)
    plot(rows, args.plot)
    print(f"wrote {os.path.abspath(args.out)} and {os.path.abspath(args.plot)}")
    return 0 if all(r["status"] == 0 and not r["leftovers"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
