"""The cost model (:mod:`tfsyncmodes.costs`) against the emulated cluster bed (:mod:`benchmarks.bed`):
predicted and measured samples per second for every ranks x link x straggler x mode of the bed's
JSON files, the relative error, and whether it is within the tolerance (15 %). Misses are kept.

    python -m benchmarks.bed_model docs/bed_*.json [--tolerance=0.15] [--fixed_alpha_us=50]
    python -m benchmarks.bed_model docs/bed_*.json --holdout=bed_8r_10gbit.json,bed_8r_1gbit.json

A row's job (``costs.Job``) is the bed as it ran: its ranks and hosts layout (hybrid's groups),
one rank's compute = the emulated wait (scaled by the straggler's factor or the Pareto tail) plus
a fitted per-step overhead, gradients of ``emulated_parameters() * 4`` bytes, the measured link
(async: the same where the file says it ran across the namespaces, else loopback,
``--loopback_gbit``; the bed shapes what a host sends only, so a worker pulls at the ps host's
rate, ``--ps_link``), hybrid's period and local steps at the trainer's defaults, hybrid's average
in slices where the file says so, one ps. persistent = rank 1 four times slower; heavy =
Pareto(``pareto_alpha``) factors of mean 1, the very factors the bed's ranks drew in the measured
epochs (:func:`benchmarks.bed_rows.run_delays`; ``--noreplay_draws``: drawn afresh); transient = four times slower from F to E seconds after the first step
(``transient_window_s``): samples go at r_fast before F and after E and at r_slow between, and
the rate is the one over the epochs after the first, as measured (older files: slow
in the middle third of the steps, the time-weighted mix; exact for sync, an approximation for
async); hybrid's transient rows are simulated round by round (:func:`benchmarks.bed_rows.hybrid_transient`), its
speed-proportional plan lagging the window's start and end; its heavy rows too, over every factor
the ranks drew from their first step (:func:`benchmarks.bed_rows.all_delays`), the plan following
each group's moving average of its steps. The straggler policy (mode ``policy``)
is simulated step by step (:func:`benchmarks.bed_rows.policy_rate`): sync judged in windows, hybrid's rounds after a
switch, back at an epoch's end, as the trainer does, with its own per-step cost fitted on its
rows without a straggler. ``--compute=real`` files enter the fit only.
Measured: the steady rate (after the first epoch) where the bed recorded it, else the run's.

The fit (:mod:`benchmarks.bed_fit`, the **sync rows only**, least squares relative to each
row's step, every term >= 0):

    measured step - E[max over ranks of the wait] = overhead + 2 (N-1) α + 2 (N-1)/N B / (η β)

with β the measured link rate and η the share of it a collective gets (fitted when the rows
span more than one link class, else 1). With sync rows at one N only, α is fixed at
``--fixed_alpha_us``. Hybrid's own per-step cost is fitted on its rows of one rank a host
without a straggler. ``--holdout`` names input files whose rows fit nothing: they are priced
with the others' constants (the 8-rank files, predicted from 2 and 4 ranks). Writes
``bed_model.json`` next to the first input and the ``bed_model`` section of BENCHMARKS.md there.
"""
from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

import numpy as np
from absl import app, flags

from benchmarks import bed_calibration as cal
from benchmarks.bed_fit import fit
from benchmarks.bed_rows import (DEFAULT, BadInput, Settings, emulated, job, load, measured, measured_samples,
                                 policy_priced, predict, run_delays, transient_fraction)
from benchmarks.benchlib import replace_section
from tfsyncmodes import costs

flags.DEFINE_float("tolerance", DEFAULT.tolerance, "Relative error that counts as a hit.")
flags.DEFINE_float("fixed_alpha_us", DEFAULT.fixed_alpha_us, "α (microseconds) when the sync rows do not "
                   "span two N (the cost model's default latency).")
flags.DEFINE_float("loopback_gbit", DEFAULT.loopback_gbit, "The unshaped link inside a host and async's loopback, Gbit/s.")
flags.DEFINE_list("holdout", [], "Names of input files whose rows fit no constant (validation only), e.g. "
                  "the 8-rank files against constants fitted at 2 and 4 ranks.")
flags.DEFINE_integer("batch_size", DEFAULT.batch_size, "The bed's --batch_size (the global batch of a sync step).")
flags.DEFINE_bool("replay_draws", DEFAULT.replay_draws, "Heavy rows: replay the Pareto factors the bed's ranks drew "
                  "over the measured epochs (seeded by --seed, rank and step) instead of drawing afresh.")
FLAGS = flags.FLAGS
NAME = "benchmarks.bed_model"

def hybrid_calibration(bed: dict, row: dict) -> bool:
    """A hybrid row that measures hybrid's own per-step cost: one rank per host and no
    straggler, so its steps have no collective and its rounds are the only exchange."""
    return (emulated(bed) and row["mode"] == "hybrid" and row["straggler"] == "none"
            and bed["hosts"][0] == 1 and bool(measured(row)))


def fit_hybrid(beds: List[dict], constants: dict, settings: Settings = DEFAULT) -> Optional[float]:
    """Hybrid's per-step bookkeeping (seconds) that makes the model meet the calibration rows
    (:func:`hybrid_calibration`), their mean; None without such a row."""
    return _fit_cost(beds, constants, settings, "hybrid", hybrid_calibration)


def policy_calibration(bed: dict, row: dict) -> bool:
    """A policy row that measures the policy's own per-step cost: no straggler, so it stays in
    sync and its steps cost sync's plus its timing and the negotiation of its process sets."""
    return (emulated(bed) and policy_priced(bed) and row["mode"] == "policy" and row["straggler"] == "none"
            and bool(measured(row)))


def fit_policy(beds: List[dict], constants: dict, settings: Settings = DEFAULT) -> Optional[float]:
    """The straggler policy's own per-step cost (seconds) that makes the model meet its rows
    without a straggler (:func:`policy_calibration`), their mean; None without such a row."""
    return _fit_cost(beds, constants, settings, "policy", policy_calibration)


def _fit_cost(beds, constants, settings, mode, calibration) -> Optional[float]:
    """The per-step cost of `mode` that meets each of its `calibration` rows, their mean.
    Bisection: the predicted rate falls as the cost grows."""
    found = []
    for bed in beds:
        for row in bed["rows"]:
            if not calibration(bed, row):
                continue

            def rate(cost):
                hybrid = cost if mode == "hybrid" else (constants.get("hybrid_s") or 0.0)
                return predict(bed, mode, "none", constants["alpha_s"], constants["overhead_s"], settings, hybrid,
                               constants.get("efficiency", 1.0), cost if mode == "policy" else 0.0)

            if rate(0.0) <= measured(row):
                found.append(0.0)
                continue
            low, high = 0.0, 0.1
            for _ in range(40):
                middle = (low + high) / 2
                low, high = (middle, high) if rate(middle) > measured(row) else (low, middle)
            found.append((low + high) / 2)
    return float(np.mean(found)) if found else None


def sync_point(bed: dict, row: dict, settings: Settings = DEFAULT) -> Optional[tuple]:
    """(2 (N-1), measured step - E[max wait], measured step, bytes term at the measured link rate)
    of a sync row; None if it cannot be fitted."""
    if row["mode"] != "sync" or not measured(row):
        return None
    if not emulated(bed) and row["straggler"] != "none":
        return None  # a real-compute straggler slows the step by its own mechanism
    ranks = bed["ranks"]
    step = settings.batch_size / measured(row)

    def wait(condition):
        if not emulated(bed):
            return 0.0
        times = costs.compute_seconds(job(bed, "sync", condition, 0.0, 0.0, settings),
                                      delays=run_delays(bed, condition, settings))
        return float(times.max(axis=1).mean())

    waits = wait(row["straggler"])
    if row["straggler"] == "transient":  # the share of its steps sync ran slowed
        if "transient_window_s" in bed:
            first, end = bed["transient_window_s"]
            # its slowed steps each wait at least the slow rank's compute: at most W / that of them
            share = min(1.0, (end - first) / waits / (measured_samples(bed, settings) / settings.batch_size))
        else:
            share = transient_fraction(bed, settings)
        waits = share * waits + (1 - share) * wait("none")
    link = min(bed["measured_mbit_s"] / 1e3, settings.loopback_gbit)
    data = costs.allreduce_seconds(ranks, cal.emulated_parameters() * 4, link, 0.0)
    return 2 * (ranks - 1), step - waits, step, data


def table(beds: List[dict], constants: dict, settings: Settings = DEFAULT, held: Optional[List[bool]] = None) -> List[dict]:
    """Every row, predicted and measured; rows a constant was fitted on say so (``fitted``);
    `held`: per bed, whether its rows were held out of the fits."""
    rows = []
    for bed, out_of_fit in zip(beds, held or [False] * len(beds)):
        for row in bed["rows"]:
            out = {"ranks": bed["ranks"], "link": bed["link"], "ps_link": bed.get("ps_link"),
                   "compute": bed.get("compute", "emulated"),
                   "straggler": row["straggler"], "mode": row["mode"], "measured": measured(row),
                   "measured_as": "steady" if row.get("steady_samples_per_s") else "whole run",
                   "predicted": None, "error": None, "within": None,
                   "fitted": not out_of_fit and (sync_point(bed, row, settings) is not None
                                                 or hybrid_calibration(bed, row) or policy_calibration(bed, row))}
            if emulated(bed) and row["mode"] in costs.MODES + ("policy",):
                out["predicted"] = predict(bed, row["mode"], row["straggler"], constants["alpha_s"],
                                           constants["overhead_s"], settings, constants.get("hybrid_s") or 0.0,
                                           constants.get("efficiency", 1.0), constants.get("policy_s") or 0.0)
            if out["predicted"] is not None and out["measured"]:
                out["error"] = out["predicted"] / out["measured"] - 1
                out["within"] = bool(abs(out["error"]) <= settings.tolerance)
            rows.append(out)
    return rows


def render(rows: List[dict], constants: dict, settings: Settings, paths: List[str]) -> str:
    tolerance = settings.tolerance
    fitted = (f"α = {constants['alpha_s'] * 1e6:.1f} us per ring hop, per-step overhead = "
              f"{constants['overhead_s'] * 1e3:.1f} ms, a collective gets {constants.get('efficiency', 1.0):.2f} of "
              f"the measured link rate ({constants['note']}"
              + (f"; rms residual {constants['rms_s'] * 1e3:.1f} ms" if constants["rms_s"] is not None else "")
              + (f", {constants['rms_relative']:.1%} of the step" if constants.get("rms_relative") is not None else "")
              + ")")
    hybrid = constants.get("hybrid_s")
    fitted += ("; hybrid's own per-step cost = " + (f"{hybrid * 1e3:.1f} ms, fitted on its rows of one rank per "
               "host without a straggler" if hybrid is not None else "0 (no hybrid row of one rank per host)"))
    policy = constants.get("policy_s")
    fitted += ("; the straggler policy's own per-step cost = " + (f"{policy * 1e3:.1f} ms, fitted on its rows "
               "without a straggler" if policy is not None else "0 (no policy row without a straggler)"))
    checked = [r for r in rows if r["within"] is not None and not r["fitted"]]
    per_mode = ", ".join(f"{mode} {sum(r['within'] for r in checked if r['mode'] == mode)} of "
                         f"{sum(r['mode'] == mode for r in checked)}"
                         for mode in costs.MODES + ("policy",) if any(r["mode"] == mode for r in checked))
    lines = ["## The cost model against the bed", "",
             f"`python -m benchmarks.bed_model {' '.join(os.path.basename(p) for p in paths)}"
             f"{' --holdout=' + ','.join(settings.holdout) if settings.holdout else ''}` — "
             f"costs.Job of each row as the bed ran it (benchmarks/bed_model.py); {fitted}. Rows marked fit "
             "gave the constants; the others are validation"
             + (f" (the rows of {', '.join(settings.holdout)} fit nothing)" if settings.holdout else "")
             + ". Async ran across the namespaces in files that say "
             "so, else on loopback, unshaped; its rows are simulated step by step, each step to the first free "
             "worker and the workers joined at every epoch's end, a worker pulling at its ps host's rate (ps: "
             "that host's link class where it differs; the bed shapes only what a host sends). "
             + ("Heavy rows replay the Pareto factors the bed's ranks drew (seeded by seed, rank and step): sync's "
                "in the measured epochs, hybrid's rounds, async's steps and the policy simulated over every factor "
                "from the first step; " if settings.replay_draws else "Heavy rows draw the Pareto factors afresh; ")
             + "Measured: "
             "the steady rate (after the first epoch) where the bed recorded it, else the whole run's (*).", "",
             f"Within {tolerance:.0%}: {sum(r['within'] for r in checked)} of the {len(checked)} validation rows "
             f"({per_mode}).", "",
             "| ranks | link | straggler | mode | predicted samples/s | measured | error | within |",
             "|---:|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        cell = (lambda v, f: "-" if v is None else format(v, f))
        within = "-" if r["within"] is None else ("yes" if r["within"] else "no")
        link = r["link"] + (f" (ps {r['ps_link']})" if r.get("ps_link") not in (None, r["link"]) else "")
        lines.append(f"| {r['ranks']} | {link}{'' if r['compute'] == 'emulated' else ' (real)'} | {r['straggler']} | "
                     f"{r['mode']} | {cell(r['predicted'], '.0f')} | "
                     f"{cell(r['measured'], '.0f')}{'' if r['measured_as'] == 'steady' else ' *'} | "
                     f"{cell(None if r['error'] is None else 100 * r['error'], '+.1f')}{'' if r['error'] is None else ' %'} | "
                     f"{within}{' (fit)' if r['fitted'] else ''} |")
    return "\n".join(lines) + "\n"


def run(paths: List[str], settings: Settings = DEFAULT) -> str:
    if not paths:
        raise BadInput("no bed JSON given; e.g. python -m benchmarks.bed_model docs/bed_4r_1gbit.json")
    names = [os.path.basename(p) for p in paths]
    for name in settings.holdout:
        if name not in names:
            raise BadInput(f"--holdout: {name} is not among the input files; name one of them, e.g. {names[-1]}")
    beds = [load(p) for p in paths]
    held = [name in settings.holdout for name in names]
    fitting = [bed for bed, out in zip(beds, held) if not out]
    if not fitting:
        raise BadInput("--holdout: every input file is held out; leave at least one to fit the constants on")
    points = [p for bed in fitting for p in map(lambda r, b=bed: sync_point(b, r, settings), bed["rows"])
              if p is not None]
    constants = fit([p[0] for p in points], [p[1] for p in points], settings.fixed_alpha_us / 1e6,
                    [p[2] for p in points], [p[3] for p in points])
    constants["hybrid_s"] = fit_hybrid(fitting, constants, settings)
    constants["policy_s"] = fit_policy(fitting, constants, settings)
    rows = table(beds, constants, settings, held)
    text = render(rows, constants, settings, paths)
    folder = os.path.dirname(os.path.abspath(paths[0]))
    with open(os.path.join(folder, "bed_model.json"), "w", encoding="utf-8") as handle:
        json.dump({"inputs": names, "holdout": list(settings.holdout), "tolerance": settings.tolerance,
                   "fit": dict(constants, fitted_on="sync rows only"), "rows": rows}, handle, indent=1)
    replace_section(os.path.join(folder, "BENCHMARKS.md"), "bed_model", text)
    return text


def main(argv):
    try:
        settings = Settings(FLAGS.tolerance, FLAGS.fixed_alpha_us, FLAGS.loopback_gbit, FLAGS.batch_size,
                            FLAGS.replay_draws, tuple(FLAGS.holdout))
        print(run(argv[1:], settings), end="")
    except BadInput as error:
        sys.stderr.write(f"{NAME}: error: {error}\n")
        sys.exit(2)


if __name__ == "__main__":
    app.run(main)
