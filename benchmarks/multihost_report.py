"""The verdict of ``python -m benchmarks.bench_multihost`` on hybrid across hosts (no flags here,
so tests import it beside other benchmarks)."""
from __future__ import annotations

import statistics

TARGET = 1.05  # hybrid's step across hosts over its one-host step (#23, at the 100 Mbit link)


def hybrid_verdicts(results) -> list:
    """Per link: hybrid's step over its one-host step, the median of each round's own ratio (the
    round's two-host job over its one-host job) and their range, against :data:`TARGET`."""
    one = next((r for r in results["rows"] if r["setting"] == "1 host" and r["mode"] == "hybrid"), None)
    out = []
    for row in results["rows"]:
        if one is None or row["mode"] != "hybrid" or row["rate"] is None:
            continue
        ratios = [a / b for a, b in zip(row["job_medians_ms"], one["job_medians_ms"])]
        met = "met" if max(ratios) <= TARGET else "missed"
        out.append(f"- hybrid, {row['setting']}: step over its one-host step {statistics.median(ratios):.3f} "
                   f"(each round: {', '.join(f'{r:.3f}' for r in ratios)}); target <= {TARGET} in every round: {met}")
    return out
