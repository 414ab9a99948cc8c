"""The cost model (:mod:`tfsyncmodes.costs`) against the emulated cluster bed (:mod:`benchmarks.bed`):
predicted and measured samples per second for every ranks x link x straggler x mode of the bed's
JSON files, the relative error, and whether it is within the tolerance (15 %). Misses are kept.

    python -m benchmarks.bed_model docs/bed_*.json [--tolerance=0.15] [--fixed_alpha_us=50]

A row's job (``costs.Job``) is the bed as it ran: its ranks and hosts layout (hybrid's groups),
one rank's compute = the emulated wait (scaled by the straggler's factor or the Pareto tail) plus
a fitted per-step overhead, gradients of ``emulated_parameters() * 4`` bytes, the measured link
(async: the same where the file says it ran across the namespaces, else loopback,
``--loopback_gbit``), hybrid's period and local steps at the trainer's defaults, hybrid's average
in slices where the file says so, one ps. persistent = rank 1 four times slower; heavy =
Pareto(``pareto_alpha``) factors of mean 1, the very factors the bed's ranks drew in the measured
epochs (:func:`run_delays`; ``--noreplay_draws``: drawn afresh); transient = four times slower from F to E seconds after the first step
(``transient_window_s``): samples go at r_fast before F and after E and at r_slow between, and
the rate is the one over the epochs after the first, as measured (older files: slow
in the middle third of the steps, the time-weighted mix; exact for sync, an approximation for
async); hybrid's transient rows are simulated round by round (:func:`hybrid_transient`), its
speed-proportional plan lagging the window's start and end. The straggler policy (mode ``policy``)
is simulated step by step (:func:`policy_rate`): sync judged in windows, hybrid's rounds after a
switch, back at an epoch's end, as the trainer does, with its own per-step cost fitted on its
rows without a straggler. ``--compute=real`` files enter the fit only.
Measured: the steady rate (after the first epoch) where the bed recorded it, else the run's.

The fit (:mod:`benchmarks.bed_fit`, the **sync rows only**, least squares relative to each
row's step, every term >= 0):

    measured step - E[max over ranks of the wait] = overhead + 2 (N-1) α + 2 (N-1)/N B / (η β)

with β the measured link rate and η the share of it a collective gets (fitted when the rows
span more than one link class, else 1). With sync rows at one N only, α is fixed at
``--fixed_alpha_us``. Hybrid's own per-step cost is fitted on its rows of one rank a host
without a straggler. Writes ``bed_model.json`` next to the first input and the ``bed_model``
section of BENCHMARKS.md there.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from typing import Dict, List, Optional

import numpy as np
from absl import app, flags

from benchmarks import bed_calibration as cal
from benchmarks.bed_fit import fit
from benchmarks.benchlib import replace_section
from tfsyncmodes import costs, knobs, simulate



@dataclasses.dataclass(frozen=True)
class Settings:
    """The flags, for callers that do not parse them."""

    tolerance: float = 0.15
    fixed_alpha_us: float = 50.0
    loopback_gbit: float = 10.0
    batch_size: int = 64
    replay_draws: bool = True


DEFAULT = Settings()
flags.DEFINE_float("tolerance", DEFAULT.tolerance, "Relative error that counts as a hit.")
flags.DEFINE_float("fixed_alpha_us", DEFAULT.fixed_alpha_us, "α (microseconds) when the sync rows do not "
                   "span two N (the cost model's default latency).")
flags.DEFINE_float("loopback_gbit", DEFAULT.loopback_gbit, "The unshaped link inside a host and async's loopback, Gbit/s.")
flags.DEFINE_integer("batch_size", DEFAULT.batch_size, "The bed's --batch_size (the global batch of a sync step).")
flags.DEFINE_bool("replay_draws", DEFAULT.replay_draws, "Heavy rows: replay the Pareto factors the bed's ranks drew "
                  "over the measured epochs (seeded by --seed, rank and step) instead of drawing afresh.")
FLAGS = flags.FLAGS
NAME = "benchmarks.bed_model"


class BadInput(Exception):
    """Input the model cannot price: one line for the user."""


def load(path: str) -> dict:
    """A bed JSON, checked for what the model reads."""
    try:
        with open(path, encoding="utf-8") as handle:
            bed = json.load(handle)
    except OSError as error:
        raise BadInput(f"{path}: cannot be read ({error.strerror}); give a bed JSON such as docs/bed_4r_1gbit.json")
    except ValueError as error:
        raise BadInput(f"{path}: is not JSON ({error}); give a bed JSON written by benchmarks.bed")
    if not isinstance(bed, dict) or not isinstance(bed.get("rows"), list) or not bed["rows"]:
        raise BadInput(f"{path}: has no rows; give a bed JSON written by benchmarks.bed")
    for key in ("ranks", "hosts", "link", "measured_mbit_s", "emulated_step_ms", "epochs"):
        if key not in bed:
            raise BadInput(f"{path}: has no {key!r}; give a bed JSON written by benchmarks.bed")
    hosts = bed["hosts"]
    if len(set(hosts)) != 1 or sum(hosts) != bed["ranks"]:
        raise BadInput(f"{path}: hosts {hosts} are not equal groups of {bed['ranks']} ranks")
    for row in bed["rows"]:
        if not isinstance(row.get("mode"), str) or row.get("straggler") not in cal.STRAGGLERS:
            raise BadInput(f"{path}: row {row.get('straggler')!r}/{row.get('mode')!r} is not a condition/mode of the bed")
    return bed


def measured(row: dict) -> Optional[float]:
    """The row's steady rate (after the first epoch: tracing and start-up excluded, what the model
    prices) where the bed recorded it, else its whole-run rate."""
    return row.get("steady_samples_per_s") or row.get("samples_per_s")


def emulated(bed: dict) -> bool:
    return bed.get("compute", "emulated") == "emulated"


def transient_steps(bed: dict, settings: Settings = DEFAULT) -> tuple:
    """(first, end, steps): the slow rank's own steps [first, end) of its `steps`, in a file whose
    transient window is in steps (the middle third)."""
    steps = cal.TRAIN_SAMPLES // settings.batch_size * bed["epochs"]
    first = steps // 3
    return first, max(first + 1, 2 * steps // 3), steps


def transient_fraction(bed: dict, settings: Settings = DEFAULT) -> float:
    """The share of its steps the transient straggler is slow, in a file whose window is in steps."""
    first, end, steps = transient_steps(bed, settings)
    return (end - first) / steps


def measured_samples(bed: dict, settings: Settings = DEFAULT) -> int:
    """The samples the measured rate covers: every epoch's but the first (the steady rate)."""
    return cal.TRAIN_SAMPLES // settings.batch_size * settings.batch_size * (bed["epochs"] - 1)


def transient_rate(bed: dict, slow: float, fast: float, settings: Settings = DEFAULT) -> float:
    """The rate of a run slowed to `slow` samples/s in the transient window, `fast` outside it."""
    if "transient_window_s" not in bed:
        share = transient_fraction(bed, settings)
        return 1.0 / (share / slow + (1 - share) / fast)
    first, end = bed["transient_window_s"]
    epoch = cal.TRAIN_SAMPLES // settings.batch_size * settings.batch_size

    def seconds_at(samples: float) -> float:  # after the first step: fast, slow in the window, fast
        before = fast * first
        if samples <= before:
            return samples / fast
        during = before + slow * (end - first)
        if samples <= during:
            return first + (samples - before) / slow
        return end + (samples - during) / fast

    # The measured rate spans the epochs after the first: the part of the window inside them.
    return measured_samples(bed, settings) / (seconds_at(epoch * bed["epochs"]) - seconds_at(epoch))


@functools.lru_cache(maxsize=None)
def _drawn(alpha: float, seed: int, ranks: int, first: int, end: int) -> np.ndarray:
    from tfsyncmodes.examples.emulated_compute import jitter_factors  # TensorFlow: only for heavy rows

    return np.stack([jitter_factors(f"pareto:{alpha:g}", seed, rank, end)[first:] for rank in range(ranks)], axis=1)


def run_delays(bed: dict, condition: str, settings: Settings = DEFAULT) -> Optional[np.ndarray]:
    """(steps, ranks): the Pareto factors a heavy row's ranks drew in the steps its measured rate
    spans (the epochs after the first). The trainer seeds each draw by (``--seed``, rank, step),
    so every run of a file drew the same ones; a short run's draws of a tail without a finite
    variance can sit far from the distribution's expectations. None: nothing to replay (another
    condition, real compute, or ``replay_draws`` off)."""
    if condition != "heavy" or not emulated(bed) or not settings.replay_draws:
        return None
    steps = cal.TRAIN_SAMPLES // settings.batch_size
    return _drawn(float(bed.get("pareto_alpha", 2.0)), int(bed.get("seed", 0)), bed["ranks"], steps,
                  steps * bed["epochs"])


def async_across(bed: dict) -> bool:
    """Whether the file's async runs crossed the namespaces' shaped links (else loopback)."""
    return str(bed.get("async_on", "")).startswith("namespaces")


def job(bed: dict, mode: str, condition: str, alpha_s: float, overhead_s: float,
        settings: Settings = DEFAULT, hybrid_s: float = 0.0, efficiency: float = 1.0) -> costs.Job:
    """The costs.Job of `mode` under `condition` (transient: its slow phase) as the bed ran it;
    `efficiency`: the share of the measured link rate a collective gets (fitted, see :func:`fit`)."""
    ranks = bed["ranks"]
    hybrid = knobs.KNOBS_BY_KEY
    on_loopback = mode == "async" and not async_across(bed)
    link = settings.loopback_gbit if on_loopback else efficiency * bed["measured_mbit_s"] / 1e3
    return costs.Job(ranks=ranks, ranks_per_host=bed["hosts"][0], step_ms=bed["emulated_step_ms"],
                     overhead_ms=overhead_s * 1e3, grad_mb=cal.emulated_parameters() * 4 / 1e6, link_gbit=link,
                     host_gbit=settings.loopback_gbit, latency_us=alpha_s * 1e6, batch=settings.batch_size // ranks,
                     straggler=cal.SLOW_FACTOR if condition in ("persistent", "transient") else 1.0,
                     pareto_alpha=bed.get("pareto_alpha", 2.0) if condition == "heavy" else 0.0,
                     period=hybrid["period"].default_for("hybrid"), epoch_steps=cal.TRAIN_SAMPLES // settings.batch_size,
                     local_steps=hybrid["local_steps"].default_for("hybrid"), hybrid_overhead_ms=hybrid_s * 1e3,
                     hybrid_slices=bed.get("hybrid_exchange") == "slices", ps=1,
                     plan_rule=bed.get("plan_rule", "nearest"))


def predict(bed: dict, mode: str, condition: str, alpha_s: float, overhead_s: float,
            settings: Settings = DEFAULT, hybrid_s: float = 0.0, efficiency: float = 1.0,
            policy_s: float = 0.0) -> Optional[float]:
    """Predicted samples/s of one row (`policy_s`: the straggler policy's own per-step cost;
    None: a row the model does not price)."""
    slow = job(bed, mode, condition, alpha_s, overhead_s, settings, hybrid_s, efficiency)
    if mode == "policy":
        return policy_rate(bed, slow, condition, settings, policy_s)
    if condition == "transient" and mode == "hybrid":
        return hybrid_transient(bed, slow, settings)
    rate = costs.predict(slow, run_delays(bed, condition, settings))[mode]
    if condition != "transient":
        return rate
    fast = costs.predict(job(bed, mode, "none", alpha_s, overhead_s, settings, hybrid_s, efficiency))[mode]
    return transient_rate(bed, rate, fast, settings)


def hybrid_transient(bed: dict, slow: costs.Job, settings: Settings = DEFAULT) -> float:
    """Hybrid's steady rate under the transient straggler, simulated round by round
    (:func:`tfsyncmodes.costs.hybrid_epochs`): its plan learns each group's speed from the
    steps before, so it lags the window's start and end. Rated as the bed rates a run: the
    run's samples over its epochs, times the epochs after the first, over their seconds."""
    window, in_steps = straggler_window(bed, "transient", settings)
    ends, samples = simulate.hybrid_epochs(slow, bed["epochs"], window, in_steps)
    return steady_rate(ends, samples)


def steady_rate(ends: np.ndarray, samples: np.ndarray) -> float:
    """A simulated run rated as the bed rates one: its samples over its epochs, times the
    epochs after the first, over their seconds."""
    return float(samples.mean()) * (len(ends) - 1) / float(ends[-1] - ends[0])


def straggler_window(bed: dict, condition: str, settings: Settings = DEFAULT) -> tuple:
    """(window, in_steps) of the slow rank under `condition`: the transient window in seconds or
    in its own steps, else the whole run."""
    if condition != "transient":
        return (0.0, np.inf), False
    if "transient_window_s" in bed:
        return tuple(bed["transient_window_s"]), False
    return transient_steps(bed, settings)[:2], True


def policy_rate(bed: dict, slow: costs.Job, condition: str, settings: Settings = DEFAULT,
                policy_s: float = 0.0) -> Optional[float]:
    """The straggler policy's steady rate, simulated step by step
    (:func:`tfsyncmodes.simulate.policy_epochs`) with the trainer's switch settings; heavy rows
    replay the factors the bed's ranks drew in every epoch. The simulation's groups are the
    hosts; the policy's are two halves of the world (its default group size): None (not priced)
    where they differ, as at 8 ranks on hosts of 2."""
    if not policy_priced(bed):
        return None
    window, in_steps = straggler_window(bed, condition, settings)
    delays = None
    if condition == "heavy" and emulated(bed) and settings.replay_draws:
        steps = cal.TRAIN_SAMPLES // settings.batch_size
        delays = _drawn(float(bed.get("pareto_alpha", 2.0)), int(bed.get("seed", 0)), bed["ranks"], 0,
                        steps * bed["epochs"])
    defaults = knobs.KNOBS_BY_KEY
    ends, samples, _ = simulate.policy_epochs(
        slow, bed["epochs"], window, in_steps, interval=int(defaults["switch_interval"].default),
        threshold=float(defaults["switch_threshold"].default), patience=int(defaults["switch_patience"].default),
        policy_overhead_ms=policy_s * 1e3, delays=delays)
    return steady_rate(ends, samples)


def hybrid_calibration(bed: dict, row: dict) -> bool:
    """A hybrid row that measures hybrid's own per-step cost: one rank per host and no
    straggler, so its steps have no collective and its rounds are the only exchange."""
    return (emulated(bed) and row["mode"] == "hybrid" and row["straggler"] == "none"
            and bed["hosts"][0] == 1 and bool(measured(row)))


def fit_hybrid(beds: List[dict], constants: dict, settings: Settings = DEFAULT) -> Optional[float]:
    """Hybrid's per-step bookkeeping (seconds) that makes the model meet the calibration rows
    (:func:`hybrid_calibration`), their mean; None without such a row."""
    return _fit_cost(beds, constants, settings, "hybrid", hybrid_calibration)


def policy_priced(bed: dict) -> bool:
    """Whether the policy's groups (two halves of the world) are the bed's hosts."""
    return bed["hosts"][0] == bed["ranks"] // 2


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


def table(beds: List[dict], constants: dict, settings: Settings = DEFAULT) -> List[dict]:
    """Every row, predicted and measured; rows a constant was fitted on say so (``fitted``)."""
    rows = []
    for bed in beds:
        for row in bed["rows"]:
            out = {"ranks": bed["ranks"], "link": bed["link"], "compute": bed.get("compute", "emulated"),
                   "straggler": row["straggler"], "mode": row["mode"], "measured": measured(row),
                   "measured_as": "steady" if row.get("steady_samples_per_s") else "whole run",
                   "predicted": None, "error": None, "within": None,
                   "fitted": sync_point(bed, row, settings) is not None or hybrid_calibration(bed, row)
                   or policy_calibration(bed, row)}
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
             f"`python -m benchmarks.bed_model {' '.join(os.path.basename(p) for p in paths)}` — "
             f"costs.Job of each row as the bed ran it (benchmarks/bed_model.py); {fitted}. Rows marked fit "
             "gave the constants; the others are validation. Async ran across the namespaces in files that say "
             "so, else on loopback, unshaped. "
             + ("Heavy rows replay the Pareto factors the bed's ranks drew in the measured epochs (seeded by "
                "seed, rank and step); " if settings.replay_draws else "Heavy rows draw the Pareto factors afresh; ")
             + "Measured: "
             "the steady rate (after the first epoch) where the bed recorded it, else the whole run's (*).", "",
             f"Within {tolerance:.0%}: {sum(r['within'] for r in checked)} of the {len(checked)} validation rows "
             f"({per_mode}).", "",
             "| ranks | link | straggler | mode | predicted samples/s | measured | error | within |",
             "|---:|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        cell = (lambda v, f: "-" if v is None else format(v, f))
        within = "-" if r["within"] is None else ("yes" if r["within"] else "no")
        lines.append(f"| {r['ranks']} | {r['link']}{'' if r['compute'] == 'emulated' else ' (real)'} | {r['straggler']} | "
                     f"{r['mode']} | {cell(r['predicted'], '.0f')} | "
                     f"{cell(r['measured'], '.0f')}{'' if r['measured_as'] == 'steady' else ' *'} | "
                     f"{cell(None if r['error'] is None else 100 * r['error'], '+.1f')}{'' if r['error'] is None else ' %'} | "
                     f"{within}{' (fit)' if r['fitted'] else ''} |")
    return "\n".join(lines) + "\n"


def run(paths: List[str], settings: Settings = DEFAULT) -> str:
    if not paths:
        raise BadInput("no bed JSON given; e.g. python -m benchmarks.bed_model docs/bed_4r_1gbit.json")
    beds = [load(p) for p in paths]
    points = [p for bed in beds for p in map(lambda r, b=bed: sync_point(b, r, settings), bed["rows"]) if p is not None]
    constants = fit([p[0] for p in points], [p[1] for p in points], settings.fixed_alpha_us / 1e6,
                    [p[2] for p in points], [p[3] for p in points])
    constants["hybrid_s"] = fit_hybrid(beds, constants, settings)
    constants["policy_s"] = fit_policy(beds, constants, settings)
    rows = table(beds, constants, settings)
    text = render(rows, constants, settings, paths)
    folder = os.path.dirname(os.path.abspath(paths[0]))
    with open(os.path.join(folder, "bed_model.json"), "w", encoding="utf-8") as handle:
        json.dump({"inputs": [os.path.basename(p) for p in paths], "tolerance": settings.tolerance,
                   "fit": dict(constants, fitted_on="sync rows only"), "rows": rows}, handle, indent=1)
    replace_section(os.path.join(folder, "BENCHMARKS.md"), "bed_model", text)
    return text


def main(argv):
    try:
        settings = Settings(FLAGS.tolerance, FLAGS.fixed_alpha_us, FLAGS.loopback_gbit, FLAGS.batch_size,
                            FLAGS.replay_draws)
        print(run(argv[1:], settings), end="")
    except BadInput as error:
        sys.stderr.write(f"{NAME}: error: {error}\n")
        sys.exit(2)


if __name__ == "__main__":
    app.run(main)
