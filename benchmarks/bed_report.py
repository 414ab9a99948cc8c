"""The BENCHMARKS.md section of one emulated cluster bed run (:mod:`benchmarks.bed`), written
from the JSON the run left (``python -m benchmarks.bed --render=FILE`` writes it again), and the
figures of its runs: seconds to a loss target, ratios to the same repeat's sync run."""
from __future__ import annotations

import re
import statistics
import sys


def section(result: dict, name: str) -> str:
    """BENCHMARKS.md's section `name` of a bed run's `result` (the JSON it wrote)."""
    rows = result["rows"]
    stragglers = result.get("stragglers") or list(dict.fromkeys(r["straggler"] for r in rows))
    modes = result.get("modes") or list(dict.fromkeys(r["mode"] for r in rows))
    ranks, link, epochs, repeats, compute = (result[k] for k in ("ranks", "link", "epochs", "repeats", "compute"))
    step_ms = result.get("emulated_step_ms", 50.0)
    step_flag = "" if step_ms == 50.0 else f" --step_ms={step_ms:g}"
    more_flags = "" if result.get("ps", 1) == 1 else f" --ps={result['ps']}"
    more_flags += "" if result.get("batch_size", 64) == 64 else f" --batch_size={result['batch_size']}"
    more_flags += "" if result.get("ps_link", link) == link else f" --ps_link={result['ps_link']}"
    more_flags += "" if result.get("queue_ms", 50.0) == 50.0 else f" --queue_ms={result['queue_ms']:g}"
    more_flags += f" --first_bytes={result['first_bytes']}" if result.get("first_bytes") else ""
    more_flags += f" --flow_queues={result['flow_queues']}" if result.get("flow_queues") else ""
    more_flags += "" if result.get("tcp_slow_start_after_idle", True) else " --notcp_slow_start_after_idle"
    more_flags += f" --extra_flags='{result['extra_flags']}'" if result.get("extra_flags") else ""
    lines = [f"## Emulated cluster bed: {ranks} ranks, link {link} ({compute} compute)", "",
             f"`python -m benchmarks.bed --ranks={ranks} --link={link} --straggler={','.join(stragglers)} "
             f"--modes={','.join(modes)} --repeats={repeats} --epochs={epochs} --compute={compute}{step_flag}{more_flags}` — "
             f"hosts {result['hosts']} (namespaces), link shaped to {result['shaped']} (measured "
             f"{result['measured_mbit_s']} Mbit/s), ResNet-50-on-V100 calibration (benchmarks/bed_calibration.py)"
             f"{'' if not step_flag else f' at {step_ms:g} ms a step'}, "
             f"{epochs} epochs, median of {repeats} runs (JSON: `docs/{name}.json`); async: "
             f"{result['async_on']}. Loss targets: sync's 1/4, 1/2, 3/4 drop from ln 10 to its final loss, "
             "at epoch ends.", "",
             "Ratio to sync: a run's seconds to each target over the same repeat's sync run's, both counted from "
             "the first step's end (tracing and start-up left out; - : not reached). Steady samples/s: after the "
             "first epoch.", "",
             "| straggler | mode | samples/s | steady samples/s (runs) | s to 1/4, 1/2, 3/4 | ratio to sync per run (1/4; 1/2; 3/4) | test accuracy (runs) |",
             "|---|---|---:|---|---|---|---|"]
    for r in rows:
        times = ", ".join("-" if v is None else f"{v:.1f}" for v in r["seconds_to_sync_loss_drop"].values())
        ratios = "; ".join(", ".join("-" if v is None else f"{v:.2f}" for v in runs)
                           for runs in r["ratio_to_sync_runs"].values()) if r["mode"] != "sync" else ""
        accuracy = ", ".join(f"{v:.3f}" for v in r["test_accuracy_runs"])
        steady = ", ".join("-" if v is None else f"{v:.0f}" for v in r["steady_samples_per_s_runs"])
        lines.append(f"| {r['straggler']} | {r['mode']} | {r['samples_per_s']:.0f} | "
                     f"{r['steady_samples_per_s'] or 0:.0f} ({steady}) | {times} | {ratios} | "
                     f"{r['test_accuracy']:.3f} ({accuracy}) |")
    lines += whole_run_lines(rows)
    lines += switch_lines(result.get("runs", []))
    lines += auto_lines(rows, stragglers)
    return "\n".join(lines) + "\n"


def whole_run_lines(rows: list) -> list:
    """Under the table, for the runs that recorded them: per repeat, the whole run's training
    time over sync's, and the seconds to sync's final test accuracy over sync's own."""
    kept = [r for r in rows if r["mode"] != "sync" and r.get("whole_run_ratio_runs")]
    if not kept:
        return []
    out = ["", "Whole runs, per repeat over the same repeat's sync run, both counted from the first step's end: "
           "the training time (to the last epoch's end), and the seconds to the first epoch end whose test accuracy is sync's final one "
           "or more (sync's own: its first such epoch end; - : not reached).", "",
           "| straggler | mode | training time / sync's | to sync's final accuracy / sync's |", "|---|---|---|---|"]
    for r in kept:
        whole = ", ".join("-" if v is None else f"{v:.2f}" for v in r["whole_run_ratio_runs"])
        accurate = ", ".join("-" if v is None else f"{v:.2f}" for v in r.get("sync_accuracy_ratio_runs") or [])
        out.append(f"| {r['straggler']} | {r['mode']} | {whole} | {accurate or 'not recorded'} |")
    return out


def switch_lines(runs: list) -> list:
    """Under the tables, for the switching runs that recorded them: per run, the epochs it
    switched in (1 first) and the mode it switched to, and the seconds its switches took, from
    each one's start to the end of the first step after it."""
    kept = [r for r in runs if r.get("mode_switches") and r.get("modes")]
    if not kept:
        return []
    out = ["", "Switches, per run: the epoch of each (1: the first) and the mode it went to, and the seconds "
           "from its start (a Horovod restart included) to the end of the first step after it (a switch at an "
           "epoch's end is timed in the next epoch).", "",
           "| straggler | mode | repeat | switches | seconds |", "|---|---|---|---|---|"]
    names = {0.0: "sync", 2.0: "hybrid"}
    for r in kept:
        # Switches alternate between the two modes from the one the run started in: the first
        # epoch's if it did not switch, else sync (the straggler policy starts there). An
        # epoch's logged mode does not say (the policy's way back to sync, at an epoch's end,
        # leaves the epoch logged in the mode it trained in).
        went, mode = [], r["modes"][0] if not r["mode_switches"][0] else 0.0
        for e, n in enumerate(r["mode_switches"]):
            for _ in range(int(n)):
                mode = 2.0 - mode
                went.append(f"{e + 1} to {names[mode]}")
        recorded = r.get("switch_seconds") or []
        seconds = ", ".join(f"{v:.2f}" for v in recorded if v > 0)
        last = max((e for e, n in enumerate(r["mode_switches"]) if n), default=None)
        if recorded and last == len(r["mode_switches"]) - 1 and not recorded[last] > 0:
            seconds = (seconds + "; " if seconds else "") + "the last: no step after it"
        out.append(f"| {r['straggler']} | {r['mode']} | {r['repeat'] + 1} | {'; '.join(went) or 'none'} | "
                   f"{seconds or 'not recorded'} |")
    return out


def best_under_horovodrun(rows: list, condition: str):
    """Of sync and hybrid (auto's candidates), the mode of the lower median time to sync's 3/4
    loss target in `condition`, counted from the first step's end (sync's own ratio is 1;
    None: hybrid was not run there, or never reached it)."""
    hybrid = next((r for r in rows if r["straggler"] == condition and r["mode"] == "hybrid"), None)
    ratios = [v for v in (hybrid or {}).get("ratio_to_sync_runs", {}).get("0.75", []) if v is not None]
    if not ratios:
        return None
    return "hybrid" if sorted(ratios)[len(ratios) // 2] < 1.0 else "sync"


def auto_lines(rows: list, stragglers: list) -> list:
    """Under the table: per condition, auto's pick in each run, the hybrid/sync rate it
    predicted, and the mode that measured best (:func:`best_under_horovodrun`)."""
    out = []
    for condition in stragglers:
        row = next((r for r in rows if r["straggler"] == condition and r["mode"] == "auto"), None)
        if row is None:
            continue
        best = best_under_horovodrun(rows, condition)
        gains = ", ".join(f"{g:.2f}" for g in row["auto_predicted_gains"])
        out.append(f"- {condition}: auto picked {', '.join(row['auto_picks'])} (hybrid/sync predicted {gains}); "
                   f"measured best of sync and hybrid: {best or 'not run'}")
    return ["", "Auto's picks (after its profile of the first 20 steps):", ""] + out if out else []


def seconds_to(run: dict, target: float, after_first_step: bool = False):
    """Seconds from the start (or from the first step's end: tracing and start-up, a fixed cost
    that a long job amortises, left out) to the first epoch end whose loss is `target` or less."""
    offset = (run.get("first_step_seconds") or 0.0) if after_first_step else 0.0
    for loss, seconds in zip(run["losses"], run["epoch_seconds"]):
        if loss <= target:
            return seconds - offset
    return None


def ratios_to_sync(done: list, sync: list, targets: dict) -> dict:
    """Per repeat: this run's seconds to each target over the same repeat's sync run's (the runs
    of a repeat are taken back to back, so they share the machine's state), both counted from
    the first step's end."""
    return {str(f): _per_repeat(done, sync, lambda run, _, t=t: seconds_to(run, t, True))
            for f, t in targets.items()}


def training_seconds(run: dict):
    """The run's training time from its first step's end to its last epoch's end (None: not
    recorded). What follows the last epoch is the job's teardown, not training: a few runs with
    heavy-tailed delays spent 25-30 s there (``train_seconds`` counts it; this does not)."""
    seconds = run.get("epoch_seconds") or ([run["train_seconds"]] if run.get("train_seconds") is not None else [])
    if not seconds:
        return None
    return seconds[-1] - (run.get("first_step_seconds") or 0.0)


def seconds_to_accuracy(run: dict, target: float):
    """Seconds from the first step's end to the first epoch end whose test accuracy is `target`
    or more (None: never, or no accuracy per epoch recorded)."""
    offset = run.get("first_step_seconds") or 0.0
    for accuracy, seconds in zip(run.get("epoch_accuracy") or [], run.get("epoch_seconds") or []):
        if accuracy >= target - 1e-9:
            return seconds - offset
    return None


def _per_repeat(done: list, sync: list, measure) -> list:
    by_repeat = {r["repeat"]: r for r in sync}
    values = []
    for run in done:
        other = by_repeat.get(run["repeat"])
        mine, theirs = (measure(run, other), measure(other, other)) if other else (None, None)
        values.append(None if mine is None or not theirs else round(mine / theirs, 3))
    return values


def whole_run_ratios(done: list, sync: list) -> list:
    """Per repeat: this run's training time over the same repeat's sync run's."""
    return _per_repeat(done, sync, lambda run, _: training_seconds(run))


def accuracy_ratios(done: list, sync: list) -> list:
    """Per repeat: this run's seconds to the sync run's final test accuracy over the sync run's
    own (the first epoch end at it or above, for either)."""
    return _per_repeat(done, sync, lambda run, other: seconds_to_accuracy(run, other["test_accuracy"]))


def median_or_none(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def auto_pick(log: str) -> dict:
    """The mode ``--sync_mode=auto`` picked after its profile, and the hybrid/sync rate it predicted."""
    pick = re.search(r"\] auto: (hybrid|sync)\b.*hybrid/sync predicted ([0-9.]+)", log)
    if pick is None:
        sys.exit("benchmarks.bed: an auto run logged no pick (its log's tail: " + log[-500:].replace("\n", " | ") + ")")
    return {"auto_pick": pick.group(1), "auto_predicted_gain": float(pick.group(2))}
