"""Sync's constants of the cost model fitted on the bed's sync rows (:mod:`benchmarks.bed_model`):
Horovod's per-collective α, a per-step overhead and the share of the measured link rate a
collective gets, by least squares with bounds."""
from __future__ import annotations

from typing import Dict

import numpy as np


def fit(hops, y, fixed_alpha_s: float, steps=None, data=None) -> Dict[str, object]:
    """α, the overhead (seconds) and the link's efficiency from
    y = overhead + hops * α + data / efficiency, least squares with every term >= 0.

    `data`: each row's bytes term at the measured link rate (None: y has it taken out already,
    efficiency 1); the efficiency is the share of that rate a collective gets (Gloo's ring in
    chunks over TCP, against one stream's rate), fitted when the rows span more than one link.
    `steps`: each row's measured step; given, each residual counts relative to its row's step
    (the model is judged by relative error, so a 3 s step at a slow link does not outweigh ten
    0.1 s steps at a fast one). Bounds by enumeration: of the fits with some terms held at 0,
    the best one whose terms are all >= 0 (exact for three terms)."""
    hops, y = np.asarray(hops, float), np.asarray(y, float)
    w = np.ones_like(y) if steps is None else 1.0 / np.asarray(steps, float)
    if len(y) == 0:
        return {"alpha_s": fixed_alpha_s, "overhead_s": 0.0, "efficiency": 1.0, "points": 0, "rms_s": None,
                "rms_relative": None, "note": "no sync rows: α fixed, overhead fixed at 0"}
    d = np.zeros_like(y) if data is None else np.asarray(data, float)
    # the efficiency is told apart from α and the overhead only if the bytes term varies on its own
    spans_links = data is not None and np.linalg.matrix_rank(np.column_stack([np.ones_like(y), hops, d])) == 3
    names = ["overhead", "alpha"] + (["data"] if spans_links else [])
    columns = {"overhead": np.ones_like(y), "alpha": hops, "data": d}
    target = y if spans_links else y - d
    if len(set(hops.tolist())) < 2:
        alpha = fixed_alpha_s
        overhead = max(0.0, float((w * w) @ (target - hops * alpha) / (w @ w)))
        values, held = {"overhead": overhead, "alpha": alpha}, []
        note = (f"too few points to fit α: the {len(y)} sync rows are all at one N; α fixed at "
                f"{fixed_alpha_s * 1e6:g} us, overhead fitted")
    else:
        best = None
        for mask in range(2 ** len(names)):
            free = [n for i, n in enumerate(names) if not mask >> i & 1]
            if not free or (spans_links and "data" not in free):
                continue
            design = np.column_stack([w * columns[n] for n in free])
            solution = np.linalg.lstsq(design, w * target, rcond=None)[0]
            if (solution < 0).any():
                continue
            cost = float(np.sum((design @ solution - w * target) ** 2))
            if best is None or cost < best[0] - 1e-18:
                best = (cost, dict(zip(free, solution.tolist())), [n for n in names if n not in free])
        _, values, held = best
        note = (f"α, overhead{' and the link efficiency' if spans_links else ''} fitted on {len(y)} sync rows at "
                f"{len(set(hops.tolist()))} ranks counts" + ("" if steps is None else ", relative to each row's step")
                + "".join(f"; {n if n != 'alpha' else 'α'} < 0 fitted, held at 0" for n in held))
    alpha, overhead = values.get("alpha", 0.0), values.get("overhead", 0.0)
    efficiency = 1.0 / values["data"] if spans_links else 1.0
    residual = target - overhead - hops * alpha - (d / efficiency if spans_links else 0.0)
    return {"alpha_s": float(alpha), "overhead_s": float(overhead), "efficiency": float(efficiency),
            "points": int(len(y)), "rms_s": float(np.sqrt(np.mean(residual ** 2))),
            "rms_relative": None if steps is None else float(np.sqrt(np.mean((w * residual) ** 2))), "note": note}
