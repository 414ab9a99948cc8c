"""The BENCHMARKS.md section of one emulated cluster bed run (:mod:`benchmarks.bed`), written
from the JSON the run left (``python -m benchmarks.bed --render=FILE`` writes it again)."""
from __future__ import annotations


def section(result: dict, name: str) -> str:
    """BENCHMARKS.md's section `name` of a bed run's `result` (the JSON it wrote)."""
    rows = result["rows"]
    stragglers = result.get("stragglers") or list(dict.fromkeys(r["straggler"] for r in rows))
    modes = result.get("modes") or list(dict.fromkeys(r["mode"] for r in rows))
    ranks, link, epochs, repeats, compute = (result[k] for k in ("ranks", "link", "epochs", "repeats", "compute"))
    step_ms = result.get("emulated_step_ms", 50.0)
    step_flag = "" if step_ms == 50.0 else f" --step_ms={step_ms:g}"
    ps_flag = "" if result.get("ps", 1) == 1 else f" --ps={result['ps']}"
    lines = [f"## Emulated cluster bed: {ranks} ranks, link {link} ({compute} compute)", "",
             f"`python -m benchmarks.bed --ranks={ranks} --link={link} --straggler={','.join(stragglers)} "
             f"--modes={','.join(modes)} --repeats={repeats} --epochs={epochs} --compute={compute}{step_flag}{ps_flag}` — "
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
    lines += auto_lines(rows, stragglers)
    return "\n".join(lines) + "\n"


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
