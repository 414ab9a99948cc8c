"""The Markdown table and the PNGs of ``benchmarks/compare_modes.py``, from its summary."""
from __future__ import annotations

import os
from typing import List


def _num(value, fmt="{:.0f}", missing="n/a"):
    return missing if value is None else fmt.format(value)


def _kb(value):
    return "n/a" if value is None else (f"{value / 1024:.1f} KiB" if value >= 1024 else f"{value:.0f} B")


def _speed(c: dict, prefix: str, factor: float) -> str:
    equal, slow = c.get(prefix + "equal", {}), c.get(prefix + "slow", {})
    text = f"{_num(equal.get('samples_per_s'))} samples/s all equal"
    if "samples_per_s_range" in equal:
        text += " ({:.0f}-{:.0f})".format(*equal["samples_per_s_range"])
    if slow.get("samples_per_s"):
        text += f"; {slow['samples_per_s']:.0f} with worker 1 {factor:g}x slow"
        if equal.get("samples_per_s"):
            text += f" ({slow['samples_per_s'] / equal['samples_per_s']:.2f} of equal)"
    return text


def _convergence(c: dict, target) -> str:
    equal, slow = c.get("equal", {}), c.get("slow", {})
    text = f"test accuracy {_num(equal.get('test_accuracy'), '{:.3f}')}, final loss {_num(equal.get('final_loss'), '{:.3f}')}"
    if target is not None:
        text += f"; loss {target:.3f} after {_num(equal.get('seconds_to_target'), '{:.1f}', 'never')} s"
        if slow:
            text += f" ({_num(slow.get('seconds_to_target'), '{:.1f}', 'never')} s with the slow worker)"
    return text


def _fault(c: dict) -> str:
    texts = []
    for key, who in (("kill", "worker 1"), ("kill_ps", "the ps")):
        kill = c.get(key)
        if not kill:
            continue
        text = kill.get("ended", "?")
        if kill.get("killed_at_seconds") is not None:
            text = f"{who} killed after epoch {kill['killed_after_epoch']}: {text}"
        if kill.get("error"):
            text += f" (`{kill['error'][:110].replace('|', '/').replace('`', '')}`)"
        if kill.get("rerun_error"):
            text += f"; rerun with the same --model_dir failed: `{kill['rerun_error'][:140].replace('|', '/').replace('`', '')}`"
        elif "resumed" in kill:
            text += ("; rerun with the same --model_dir resumed at epoch " + str(kill["rerun_first_epoch"])
                     if kill["resumed"] else "; rerun with the same --model_dir started over at epoch 0")
        if kill.get("extra_seconds") is not None:
            text += f"; {kill['extra_seconds']:+.0f} s against the equal run"
        if kill.get("test_accuracy") is not None:
            text += f"; test accuracy {kill['test_accuracy']:.3f}"
        texts.append(text)
    return "<br>".join(texts) or "not run"


def _communication(c: dict) -> str:
    equal = c.get("equal", {})
    text = f"{_kb(equal.get('bytes_per_step'))}/step per worker ({equal.get('bytes_how', 'n/a')})"
    if equal.get("compression_ratio") is not None:
        text += f", {equal['compression_ratio']:.4f} of dense per step"
        if equal.get("cross_group") == "periodic":
            text += (f" ({equal['compression_ratio_per_exchange']:.4f} per exchange, one every "
                     f"{equal.get('steps_per_exchange', equal['staleness_bound'] + 1):.1f} steps)")
    if equal.get("staleness_mean") is not None:
        text += f"; staleness mean {equal['staleness_mean']:.2f}, max {equal['staleness_max']:.0f} updates"
    if equal.get("cross_group_lag_mean") is not None:
        text += f"; cross-group lag {equal['cross_group_lag_mean']:.2f} steps"
    return text


def markdown(result: dict) -> str:
    s, m, summary = result["settings"], result["machine"], result["summary"]
    cols = summary["columns"]
    main = [label for label, c in cols.items() if any(r.get("mode") == label for r in c.values())]
    variants = [label for label in cols if label not in main]
    emulated = any(k.startswith("emulated") for c in cols.values() for k in c)
    factor = s["slow_factor"]
    data = s["data"] or s["dataset"]
    threads = {0: "TensorFlow's default threads", 1: "one intra-op thread"}.get(
        s.get("intra_op_threads", 0), f"{s.get('intra_op_threads')} intra-op threads")
    lines = [
        "## The modes compared",
        "",
        f"`python -m benchmarks.compare_modes` — {s['workers']} workers, {data}, "
        f"{s['model'] or 'the MLP of scripts/train.py'}, {s['epochs']} epochs, batch {s['batch_size']} per step "
        f"(the same samples in every mode), {threads} per process. Measured on {m['date']} on a shared {m['cores']}-core machine "
        f"(load average {m['load_average_before'][0]:.1f} before, {m['load_average_after'][0]:.1f} after; "
        f"{m['total_seconds'] / 60:.1f} min in all): other work on the machine moves these numbers. "
        f"Raw results: `docs/compare_modes.json`.",
        "",
        "| | " + " | ".join(main) + " |",
        "|---|" + "---|" * len(main),
        "| speed | " + " | ".join(_speed(cols[c], "", factor) for c in main) + " |",
    ]
    if emulated:
        lines.append(f"| speed, emulated compute ({s['compute_ms']:g} ms per {s['batch_size']} samples) | "
                     + " | ".join(_speed(cols[c], "emulated ", factor) for c in main) + " |")
    lines += [
        "| convergence | " + " | ".join(_convergence(cols[c], summary["target_loss"]) for c in main) + " |",
        "| fault tolerance | " + " | ".join(_fault(cols[c]) for c in main) + " |",
        "| communication | " + " | ".join(_communication(cols[c]) for c in main) + " |",
        "",
    ]
    if variants:
        lines += ["Variants (hybrid policies and `--variant` columns):", "",
                  "| variant | speed | convergence | communication |", "|---|---|---|---|"]
        lines += [f"| {v} | {_speed(cols[v], '', factor)} | {_convergence(cols[v], summary['target_loss'])} | "
                  f"{_communication(cols[v])} |" for v in variants]
        lines.append("")
    lines += ["Targets:", ""]
    for t in summary["targets"]:
        extra = ""
        if "core_sharing_cap" in t:
            extra = (f" (unslowed cluster over N x one worker alone, the cap of sharing the cores: "
                     f"{_num(t['core_sharing_cap'], '{:.3f}')}; ratio with the cap divided out: "
                     f"{_num(t['value_cap_divided'], '{:.3f}')})")
        lines.append(f"- {t['name']}: **{_num(t['value'], '{:.3f}')}**, target {t['target']}: "
                     f"{'holds' if t['holds'] else 'does not hold'}{extra}")
    lines += [
        "",
        "How to read it: samples/s = samples trained after the first epoch (which also traces and warms "
        "up) over the time from the first epoch's end to the last's, as the chief logged them. "
        f"Time to target = seconds of training until the chief's epoch loss first reaches {_num(summary['target_loss'], '{:.3f}')} "
        "(the largest final loss of the all-equal runs, so every mode reaches it; between epoch ends, "
        "linear; the emulated runs, shorter, have their own target: "
        f"{_num(summary.get('target_loss_emulated'), '{:.3f}')}). Bytes: hybrid counts the cross-group payloads it really sent; for sync and async "
        "they are computed from the parameter count (the package counts no bytes there). Async trains "
        "with SGD + momentum, sync and hybrid with Adam (scripts/train.py). With more processes "
        "(chief, ps, workers) than cores the workers share the cores, which caps every ratio to the "
        "sum of individual rates; the emulated-compute runs, whose steps mostly sleep, measure what "
        "the mode itself costs (they run "
        f"{s.get('emulated_epochs', s['epochs'])} epochs). The fault-tolerance cell's extra seconds are the wall-clock time of "
        "the killed run (and of its rerun, where it stopped) minus the all-equal run's, start-up included; on a shared machine they move by tens of "
        "seconds.",
    ]
    return "\n".join(lines)


def plots(result: dict, out_dir: str) -> List[str]:
    """docs/compare_modes_loss.png and docs/compare_modes_speed.png (needs matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        print("compare_modes: matplotlib is missing, no plots (pip install .[bench])")
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = result["summary"]["columns"]
    main = [label for label, c in cols.items() if any(r.get("mode") == label for r in c.values())]
    keys = [k for k in ("equal", "slow", "kill", "kill_ps", "emulated equal", "emulated slow")
            if any(k in c for c in cols.values())]
    colors = {label: f"C{i}" for i, label in enumerate(cols)}
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ncols = min(3, len(keys))
    nrows = (len(keys) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.axis("off")
    for ax, key in zip(axes.flat, keys):
        for label, c in cols.items():
            row = c.get(key)
            if not row or not row.get("curve"):
                continue
            style = "-" if label in main else ":"
            t, loss = zip(*row["curve"])
            ax.plot(t, loss, style, marker="o", ms=3, color=colors[label], label=label)
            if row.get("killed_at_seconds") is not None and row.get("rerun_curve"):
                t2, l2 = zip(*row["rerun_curve"])
                ax.plot(t2, l2, "--", marker="x", ms=3, color=colors[label], label=f"{label} rerun")
        target = result["summary"].get("target_loss_emulated" if key.startswith("emulated") else "target_loss")
        if target is not None:
            ax.axhline(target, color="grey", lw=0.8, ls="--")
        if key.startswith("kill") or key == "equal":
            ax.legend(fontsize=7)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        factor = f"worker 1 {result['settings']['slow_factor']:g}x slow"
        ax.set_title({"equal": "all workers equal", "slow": factor, "kill": "worker 1 killed midway",
                      "kill_ps": "ps killed midway (async)",
                      "emulated equal": f"emulated compute ({result['settings']['compute_ms']:g} ms per "
                      f"{result['settings']['batch_size']} samples), equal",
                      "emulated slow": f"emulated compute, {factor}"}.get(key, key), fontsize=10)
        ax.set_xlabel("seconds since training started")
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("training loss (chief, per epoch)")
    fig.suptitle(f"Loss against wall-clock time, {result['settings']['workers']} workers, "
                 f"{result['machine']['cores']}-core shared machine (dashed: target loss)", fontsize=10)
    fig.tight_layout()
    loss_path = os.path.join(out_dir, "compare_modes_loss.png")
    fig.savefig(loss_path, dpi=110)
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    labels = [label for label in cols if cols[label].get("equal", {}).get("bytes_per_step")]
    values = [cols[label]["equal"]["bytes_per_step"] for label in labels]
    bars = left.bar(range(len(labels)), values, color=[colors[label] for label in labels])
    left.bar_label(bars, labels=[f"{v / 1024:.1f} KiB" for v in values], fontsize=7)
    left.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    left.set_yscale("log")
    left.set_ylabel("bytes per step per worker")
    left.set_title("communication (hybrid: measured cross-group; others: from parameter count)", fontsize=9)
    speed_keys = [k for k in ("equal", "slow", "emulated equal", "emulated slow") if k in keys]
    width = 0.8 / max(1, len(main))
    for i, label in enumerate(main):
        rates = [cols[label].get(k, {}).get("samples_per_s") or 0 for k in speed_keys]
        bars = right.bar([x + i * width for x in range(len(speed_keys))], rates, width, color=colors[label], label=label)
        right.bar_label(bars, labels=[f"{r:.0f}" for r in rates], fontsize=7)
    right.set_xticks([x + width * (len(main) - 1) / 2 for x in range(len(speed_keys))], speed_keys)
    right.set_ylabel("samples per second")
    right.set_title("throughput by condition", fontsize=9)
    right.legend(fontsize=8)
    fig.tight_layout()
    speed_path = os.path.join(out_dir, "compare_modes_speed.png")
    fig.savefig(speed_path, dpi=110)
    plt.close(fig)
    return [loss_path, speed_path]
