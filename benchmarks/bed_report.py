"""The BENCHMARKS.md section of one emulated cluster bed run (:mod:`benchmarks.bed`), written
from the JSON the run left (``python -m benchmarks.bed --render=FILE`` writes it again)."""
from __future__ import annotations


def section(result: dict, name: str) -> str:
    """BENCHMARKS.md's section `name` of a bed run's `result` (the JSON it wrote)."""
    rows = result["rows"]
    stragglers = result.get("stragglers") or list(dict.fromkeys(r["straggler"] for r in rows))
    modes = result.get("modes") or list(dict.fromkeys(r["mode"] for r in rows))
    ranks, link, epochs, repeats, compute = (result[k] for k in ("ranks", "link", "epochs", "repeats", "compute"))
    lines = [f"## Emulated cluster bed: {ranks} ranks, link {link} ({compute} compute)", "",
             f"`python -m benchmarks.bed --ranks={ranks} --link={link} --straggler={','.join(stragglers)} "
             f"--modes={','.join(modes)} --repeats={repeats} --epochs={epochs} --compute={compute}` — "
             f"hosts {result['hosts']} (namespaces), link shaped to {result['shaped']} (measured "
             f"{result['measured_mbit_s']} Mbit/s), ResNet-50-on-V100 calibration (benchmarks/bed_calibration.py), "
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
    return "\n".join(lines) + "\n"
