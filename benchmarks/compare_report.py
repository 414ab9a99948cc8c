"""From the raw runs of ``benchmarks/compare_modes.py`` to numbers, the Markdown table and the plots.

Everything here works on the JSON alone, so ``compare_modes.py --report_only`` can rebuild the
table and plots without running anything.
"""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional

TARGETS = {"async_ratio": 0.85, "hybrid_time_ratio": 0.6, "topk_bytes_ratio": 0.025, "accuracy_points": 1.0}


def samples_per_second(run: dict) -> Optional[float]:
    """Samples per second after the first epoch (which also traces and warms up), from the
    chief's epoch ends; with one epoch, over the whole training time."""
    metrics = run.get("metrics") or {}
    if not metrics.get("train_seconds"):
        return None
    ends = [row["wall_time"] for row in run.get("curve", []) if row["epoch"] >= 0]
    per_epoch = metrics["steps"] * metrics["batch_size"] / metrics["epochs"]
    if len(ends) == metrics["epochs"] >= 2 and ends[-1] > ends[0]:
        return per_epoch * (len(ends) - 1) / (ends[-1] - ends[0])
    return metrics["steps"] * metrics["batch_size"] / metrics["train_seconds"]


def _key(run: dict) -> str:
    return ("emulated " if run["emulated"] else "") + run["condition"]


def _startups(runs: List[dict]) -> Dict[str, float]:
    """Median seconds from starting the job to the start of training, per mode."""
    by_mode: Dict[str, list] = {}
    for run in runs:
        metrics = run.get("metrics") or {}
        if "fit_started_unix" in metrics:
            by_mode.setdefault(run["mode"], []).append(metrics["fit_started_unix"] - run["started_unix"])
    return {mode: statistics.median(values) for mode, values in by_mode.items()}


def fit_start(run: dict, startups: Dict[str, float]) -> float:
    """When training began: from the final metrics; for a run that wrote none (killed), when
    TensorBoard logged the model, else the job's start plus the mode's median start-up time."""
    metrics = run.get("metrics") or {}
    if "fit_started_unix" in metrics:
        return metrics["fit_started_unix"]
    begin = [row["wall_time"] for row in run.get("curve", []) if row["epoch"] < 0]
    return begin[0] if begin else run["started_unix"] + startups.get(run["mode"], 0.0)


def curve(run: dict, startups: Dict[str, float], origin: Optional[float] = None) -> List[list]:
    """[[seconds since training started, loss], ...] at each epoch's end."""
    origin = fit_start(run, startups) if origin is None else origin
    return [[round(row["wall_time"] - origin, 3), row["loss"]] for row in run.get("curve", []) if "loss" in row]


def time_to(points: List[list], target: float) -> Optional[float]:
    """First time the loss is at or below `target`, linear between epoch ends (None: never)."""
    previous = [0.0, None]
    for t, loss in points:
        if loss <= target:
            if previous[1] is None or previous[1] == loss:
                return t
            return previous[0] + (t - previous[0]) * (previous[1] - target) / (previous[1] - loss)
        previous = [t, loss]
    return None


def exchanges(metrics: dict, period: int, policy: str):
    """(dense payloads per cross-group exchange, steps per exchange), measured.

    ``compression_ratio`` is, per epoch, the mean over ranks of a rank's bytes over its steps
    (as float32 payloads). With ``--local_steps=auto`` a group runs ``local_steps_group<g>``
    steps a round, so its ranks' ratio is c / L_g for c payloads an exchange: c is the epoch's
    ratio over the mean of 1/L_g across groups (groups of one size). Without that record, a
    ``periodic`` run exchanges every `period` steps and a ``stale`` one every step."""
    ratios = metrics.get("compression_ratio", [0.0])
    groups = sorted(k for k in metrics if k.startswith("local_steps_group"))
    if groups:
        per_exchange, steps = [], []
        for epoch, ratio in enumerate(ratios):
            lengths = [metrics[g][epoch] for g in groups if epoch < len(metrics[g])]
            if lengths and all(length > 0 for length in lengths):
                per_exchange.append(ratio / statistics.fmean(1.0 / length for length in lengths))
                steps.extend(lengths)
        if per_exchange:
            return statistics.fmean(per_exchange), statistics.fmean(steps)
    every = period if policy == "periodic" else 1
    return statistics.fmean(ratios) * every, float(every)


def _bytes(run: dict) -> dict:
    """Bytes one worker exchanges per step: measured cross-group payloads where the mode counts
    them (hybrid), else computed from the parameter count (float32)."""
    metrics = run.get("metrics") or {}
    params = metrics.get("params", 0)
    if "bytes_sent" in metrics:
        # Runs recorded before the knobs' flags were --sync_<key> name them --<key>.
        given = {f[2:].split("=")[0].removeprefix("sync_"): f.split("=", 1)[1]
                 for f in run["flags"] if f.startswith("--") and "=" in f}
        group = int(given.get("group_size", 1))
        within = 4 * params if group > 1 and "groups" not in given else 0
        cross = statistics.fmean(metrics["bytes_sent"])
        from tfsyncmodes import config

        default = lambda key: config.KNOBS_BY_KEY[key].default  # noqa: E731
        policy = given.get("cross_group", default("cross_group"))
        staleness = int(given.get("staleness", default("staleness")))
        # periodic exchanges once every period steps (staleness + 1 in runs recorded before the
        # knob period, which set it with --staleness); stale every step
        recorded_before_period = any(f.startswith("--staleness=") for f in run["flags"])
        period = staleness + 1 if recorded_before_period else int(given.get("period", default("period")))
        per_exchange, steps_per_exchange = exchanges(metrics, period, policy)
        return {"compression_ratio_per_exchange": per_exchange, "steps_per_exchange": steps_per_exchange,
                "compression": given.get("compression", default("compression")), "cross_group": policy,
                "staleness_bound": staleness, "bytes_per_step": cross + within, "bytes_cross_group": cross,
                "bytes_within_group": within, "compression_ratio": statistics.fmean(metrics.get("compression_ratio", [0.0])),
                "bytes_how": "measured cross-group payloads" + (" + dense within group" if within else "")}
    if run["on_ps"]:
        return {"bytes_per_step": 8 * params, "bytes_how": "computed: variables read + gradients written"}
    return {"bytes_per_step": 4 * params, "bytes_how": "computed: float32 gradients into allreduce"}


def _kill_outcome(run: dict, equal_wall: Optional[float]) -> dict:
    out = {"killed_at_seconds": run.get("killed_at_seconds"), "killed_after_epoch": run.get("killed_after_epoch")}
    total = run["wall_seconds"]
    if run.get("killed_at_seconds") is None:
        out["ended"] = "no worker was killed (the run ended first)"
    elif run["returncode"] == 0:
        out["ended"] = "finished"
    else:
        out["ended"] = "stopped with an error" if run.get("error") else "stopped without a message"
        out["error"] = run.get("error", "")
        rerun = run.get("rerun")
        if rerun:
            total += rerun["wall_seconds"]
            # The epochs the rerun trained, from its own metrics: its curve, read from the model
            # dir, also holds the epochs the backup's History brought back from the first run.
            epochs = (rerun.get("metrics") or {}).get("epochs_run") or [
                row["epoch"] for row in rerun.get("curve", []) if row["epoch"] >= 0]
            out["rerun_returncode"] = rerun["returncode"]
            if rerun["returncode"] != 0:
                out["rerun_error"] = rerun.get("error", "")
            out["rerun_first_epoch"] = min(epochs) if epochs else None
            out["resumed"] = bool(epochs) and min(epochs) > 0
    if run.get("timed_out"):
        out["ended"] = "hung until the timeout"
    out["total_wall_seconds"] = round(total, 1)
    if equal_wall:
        out["extra_seconds"] = round(total - equal_wall, 1)
    metrics = (run.get("rerun") or {}).get("metrics") or run.get("metrics") or {}
    if "test_accuracy" in metrics:
        out["test_accuracy"] = metrics["test_accuracy"]
    return out


def summarize(result: dict) -> dict:
    runs = result["runs"]
    startups = _startups(runs)
    cells: Dict[str, Dict[str, dict]] = {}
    for run in runs:
        cell = cells.setdefault(run["column"], {}).setdefault(_key(run), {"repeats": []})
        metrics = run.get("metrics") or {}
        if samples_per_second(run):
            cell["repeats"].append(samples_per_second(run))
        if run["repeat"] == 0:
            cell.update(mode=run["mode"], run=run)
    given = result["settings"].get("target_loss")
    targets_by = {}
    for prefix in ("", "emulated "):
        finals = [curve(c[prefix + "equal"]["run"], startups)[-1][1] for label, c in cells.items()
                  if prefix + "equal" in c and c[prefix + "equal"]["run"]["mode"] == label
                  and curve(c[prefix + "equal"]["run"], startups)]
        targets_by[prefix] = given if given is not None else (max(finals) if finals else None)
    target = targets_by[""]
    summary = {"target_loss": target, "target_loss_emulated": targets_by["emulated "],
               "startup_seconds": startups, "columns": {}}
    for label, conditions in cells.items():
        equal_wall = conditions.get("equal", {}).get("run", {}).get("wall_seconds")
        out = summary["columns"].setdefault(label, {})
        for key, cell in conditions.items():
            run = cell.pop("run")
            metrics = run.get("metrics") or {}
            row = {"mode": cell["mode"], "wall_seconds": run["wall_seconds"], "returncode": run["returncode"]}
            if cell["repeats"]:
                row["samples_per_s"] = round(statistics.median(cell["repeats"]), 1)
                if len(cell["repeats"]) > 1:
                    row["samples_per_s_range"] = [round(min(cell["repeats"]), 1), round(max(cell["repeats"]), 1)]
            if metrics:
                row.update(test_accuracy=metrics["test_accuracy"], final_loss=metrics["final_loss"],
                           steps=metrics["steps"], params=metrics["params"], train_seconds=metrics["train_seconds"])
                row.update(_bytes(run))
                if "staleness_mean" in metrics:
                    row["staleness_mean"] = round(statistics.fmean(metrics["staleness_mean"]), 2)
                    row["staleness_max"] = max(metrics["staleness_max"])
                if "cross_group_lag" in metrics:
                    row["cross_group_lag_mean"] = round(statistics.fmean(metrics["cross_group_lag"]), 2)
            points = curve(run, startups)
            row["curve"] = points
            own_target = targets_by["emulated " if run["emulated"] else ""]
            if own_target is not None:
                row["seconds_to_target"] = time_to(points, own_target)
            if run["condition"].startswith("kill"):
                row.update(_kill_outcome(run, equal_wall))
                if run.get("rerun"):
                    origin = fit_start(run, startups)
                    row["rerun_curve"] = curve(run["rerun"] | {"mode": run["mode"]}, startups, origin)
            out[key] = row
    summary["targets"] = targets(summary, result["settings"])
    return summary


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def targets(summary: dict, settings: dict) -> list:
    cols = summary["columns"]
    found = []
    for prefix in ("", "emulated "):
        for label, conditions in cols.items():
            if label != conditions.get(prefix + "equal", {}).get("mode") or prefix + "solo" not in conditions:
                continue
            get = lambda k: conditions.get(prefix + k, {}).get("samples_per_s")  # noqa: E731
            n = settings["workers"]
            if None in (get("slow"), get("equal"), get("solo"), get("solo slow")):
                continue
            ratio = _ratio(get("slow"), (n - 1) * get("solo") + get("solo slow"))
            cap = _ratio(get("equal"), n * get("solo"))
            found.append({"name": f"{label} throughput, worker 1 {settings['slow_factor']:g}x slow, over the sum "
                          f"of the workers' individual rates{' (emulated compute)' if prefix else ''}",
                          "value": ratio, "core_sharing_cap": cap, "value_cap_divided": _ratio(ratio, cap),
                          "target": f">= {TARGETS['async_ratio']}", "holds": ratio >= TARGETS["async_ratio"]})
    sync, hybrid = cols.get("sync", {}), cols.get("hybrid", {})
    for key in ("slow", "emulated slow"):
        a, b = hybrid.get(key, {}).get("seconds_to_target"), sync.get(key, {}).get("seconds_to_target")
        if key in sync and key in hybrid:
            value = _ratio(a, b)
            loss = summary["target_loss_emulated" if key.startswith("emulated") else "target_loss"]
            found.append({"name": f"hybrid time to loss {loss:.3f} over sync's, worker 1 slow ({key})", "value": value,
                          "target": f"<= {TARGETS['hybrid_time_ratio']}",
                          "holds": value is not None and value <= TARGETS["hybrid_time_ratio"]})
    equal = hybrid.get("equal", {})
    topk = equal.get("compression_ratio_per_exchange") if equal.get("compression") == "topk" else None
    if topk is not None:  # the target is Top-K's; a dense exchange sends one payload by design
        found.append({"name": "hybrid Top-K bytes over dense, per cross-group exchange", "value": round(topk, 4),
                      "target": f"<= {TARGETS['topk_bytes_ratio']}", "holds": topk <= TARGETS["topk_bytes_ratio"]})
    a, b = hybrid.get("equal", {}).get("test_accuracy"), sync.get("equal", {}).get("test_accuracy")
    if a is not None and b is not None:
        points = round(100 * (b - a), 2)
        found.append({"name": "hybrid test accuracy below sync's, points", "value": points,
                      "target": f"<= {TARGETS['accuracy_points']}", "holds": points <= TARGETS["accuracy_points"]})
    return found


def one_line(run: dict) -> str:
    """What one run did, for the progress line."""
    metrics = run.get("metrics") or {}
    parts = []
    if run.get("killed_at_seconds") is not None:
        who = "ps:0" if run["condition"] == "kill_ps" else "worker 1"
        parts.append(f"{who} killed at {run['killed_at_seconds']:.0f} s")
    if metrics.get("train_seconds"):
        rate = samples_per_second(run)
        parts.append(f"{rate:.0f} samples/s, test accuracy {metrics['test_accuracy']:.3f}")
    if run["returncode"] != 0:
        parts.append(f"exit {run['returncode']}: {run.get('error', '')[:120]}")
    if run.get("rerun"):
        parts.append(f"rerun exit {run['rerun']['returncode']}")
    return "; ".join(parts) + f" ({run['wall_seconds']:.0f} s)"
