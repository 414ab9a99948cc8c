"""``python -m benchmarks.compress_cost``: a cell is the median over the rounds (of the ratio
taken within each round) and their range; a small real run writes every compression's row, with
the compiled kernels and with TensorFlow ops, from its own rounds, and judges the 0.10 target on
the worst round; bad flags are one line, status 2."""
import json
import subprocess

import numpy as np
import pytest

from benchmarks.benchlib import rounds_cell, rounds_text
from tests.conftest import PYTHON, REPO, check_bad_benchmark_flag, clean_env


def test_a_cell_is_the_median_of_each_rounds_own_ratio_and_its_range():
    rounds = [{"a": 0.002, "step": 0.010}, {"a": 0.003, "step": 0.020}, {"a": 0.004, "step": 0.010}]
    assert rounds_cell(rounds, "a") == pytest.approx((3.0, 2.0, 4.0))  # ms
    # Per round 0.2, 0.15, 0.4: the median 0.2 (not 0.003 / 0.010, the ratio of the medians).
    assert rounds_cell(rounds, "a", "step") == pytest.approx((0.2, 0.15, 0.4))
    assert rounds_text((0.2, 0.15, 0.4)) == "0.200 [0.150-0.400]"


def test_a_small_run_reports_every_compression_from_its_rounds(tmp_path):
    (tmp_path / "BENCHMARKS.md").write_text("# Benchmarks\n\nkept\n")
    result = subprocess.run([PYTHON, "-m", "benchmarks.compress_cost", "--rounds=2", "--pairs=10", "--hidden_units=16",
                             "--compressions=int2,topk_int8", f"--docs_dir={tmp_path}"],
                            capture_output=True, text=True, timeout=300, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "compress_cost.json").read_text())
    assert data["parameters"] == 64 * 16 + 16 + 16 * 16 + 16 + 16 * 10 + 10
    assert len(data["rounds"]) == 2
    rows = ["int2", "int2@ops", "topk_int8", "topk_int8@ops"]
    assert data["compressions"] == rows
    names = {f"{c}.{k}" for c in rows for k in ("one", "ranks", "feedback", "added", "added_tensor")}
    assert names | {"dense_step_16", "dense_step_64", "step_16", "flat.added", "empty_call"} == set(data["rounds"][0])
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert text.startswith("# Benchmarks\n\nkept\n") and "<!-- bench:compress_cost:end -->" in text
    for name in rows:
        label = f"`{name.split('@')[0]}`" + (" (ops)" if name.endswith("@ops") else "")
        row = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        named = name.replace("@ops", " (ops)")
        inside = [r[f"{name}.added"] / r["step_16"] for r in data["rounds"]]
        per_tensor = [r[f"{name}.added_tensor"] / r["step_16"] for r in data["rounds"]]
        ratios = [r[f"{name}.one"] / r["dense_step_16"] for r in data["rounds"]]
        for cell, values, what in ((cells[1], inside, "added inside a step"),
                                   (cells[2], per_tensor, "per tensor, added inside a step"),
                                   (cells[4], ratios, "as a call of its own")):
            assert cell == f"**{np.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]**"
            line = next(line for line in text.splitlines() if line.startswith(f"Within 0.10 in every round, {what}"))
            met = max(values) <= 0.10
            assert (named in line.split(";")[0].split(": ")[1].rstrip(".").split(", ")) == met, line
            assert (named in line.split("; missed: ")[1].rstrip(".").split(", ")) != met, line


@pytest.mark.parametrize("flag,words", [("--compressions=int3", "--compressions: 'int3' is not a compression"),
                                        ("--rounds=0", "--rounds: 0 is too small"),
                                        ("--pairs=0", "--pairs: 0 is too small"),
                                        ("--implementations=fast", "--implementations: 'fast' is not an implementation"),
                                        ("--topk_ratio=1.5", "--topk_ratio: 1.5 is not a fraction")])
def test_a_bad_flag_is_one_line_and_status_2(tmp_path, flag, words):
    check_bad_benchmark_flag("compress_cost", flag, words, tmp_path)
