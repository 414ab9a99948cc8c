"""benchmarks.bed_scaling: which file each link x ranks x mode comes from, the share of the
compute-only rate worked out here by hand, the model's share against the sync formula written
here (one ring per step, the barrier on the largest wait), the table, JSON and PNG the command
writes, and its bad input."""
import json
import subprocess

import pytest

from benchmarks import bed_rows, bed_scaling
from tests.conftest import PYTHON, REPO, clean_env

B = (64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10) * 4  # the bed's MLP's float32 gradients, bytes
ALPHA, OVERHEAD, MBIT = 100e-6, 0.010, 20.0


def bed(ranks, hosts, link="1gbit", step_ms=50.0, rows=()):
    return {"ranks": ranks, "hosts": list(hosts), "link": link, "compute": "emulated", "measured_mbit_s": MBIT,
            "emulated_step_ms": step_ms, "epochs": 3, "pareto_alpha": 2.0, "rows": list(rows)}


def row(straggler, mode, runs, ratios=None, accuracy=(0.98, 0.97, 0.99)):
    out = {"straggler": straggler, "mode": mode, "samples_per_s": min(runs), "steady_samples_per_s": sorted(runs)[1],
           "steady_samples_per_s_runs": list(runs), "test_accuracy_runs": list(accuracy)}
    if ratios is not None:
        out["ratio_to_sync_runs"] = {"0.25": ratios[0], "0.5": ratios[1], "0.75": ratios[2]}
    return out


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(json.dumps(content))
    return str(path)


def test_each_row_comes_from_the_last_file_and_its_share_is_the_rate_over_batch_per_step(tmp_path):
    old = write(tmp_path, "old.json", bed(4, (2, 2), rows=[row("heavy", "sync", [100, 100, 100]),
                                                           row("heavy", "hybrid", [200, 200, 200], [[9], [9], [9]])]))
    new = write(tmp_path, "new.json", bed(4, (2, 2), rows=[
        row("heavy", "sync", [640, 600, 700]), row("none", "hybrid", [1000, 1000, 1000]),
        row("heavy", "hybrid", [800, 768, 896], [[0.5, 0.7, 0.6], [0.4, 0.4, 0.4], [1.2, 0.9, 1.0]])]))
    eight = write(tmp_path, "eight.json", bed(8, (2, 2, 2, 2), step_ms=200.0, rows=[row("heavy", "sync", [96, 96, 96])]))
    rows = bed_scaling.rows_of([old, new, eight], "heavy", None)
    assert [(r["ranks"], r["mode"], r["file"]) for r in rows] == [(4, "sync", "new.json"), (4, "hybrid", "new.json"),
                                                                  (8, "sync", "eight.json")]
    sync, hybrid, big = rows
    # 640 samples/s at 64 samples a 50 ms step: 640 * 0.05 / 64 = 0.5 of the compute-only rate.
    assert sync["share"] == pytest.approx({"median": 0.5, "min": 600 * 0.05 / 64, "max": 700 * 0.05 / 64})
    assert hybrid["share"] == pytest.approx({"median": 0.625, "min": 0.6, "max": 0.7})
    assert big["share"]["median"] == pytest.approx(96 * 0.2 / 64)  # 0.3: the step's length counts
    assert hybrid["ratio_to_sync"]["0.25"] == pytest.approx({"median": 0.6, "min": 0.5, "max": 0.7})
    assert hybrid["ratio_to_sync"]["0.75"] == pytest.approx({"median": 1.0, "min": 0.9, "max": 1.2})
    assert hybrid["test_accuracy"] == pytest.approx({"median": 0.98, "min": 0.97, "max": 0.99})
    assert all(r["predicted_share"] is None for r in rows)


def test_the_models_share_of_a_sync_row_is_the_barrier_and_ring_formula(tmp_path):
    path = write(tmp_path, "bed.json", bed(4, (2, 2), rows=[row("persistent", "sync", [300, 300, 300])]))
    constants = {"alpha_s": ALPHA, "overhead_s": OVERHEAD, "efficiency": 1.0, "hybrid_s": None, "policy_s": None}
    (got,) = bed_scaling.rows_of([path], "persistent", constants)
    # One step: the slowest rank's wait (4 x 50 ms) + the overhead + a ring over 4 ranks of B bytes.
    ring = 2 * 3 * ALPHA + 2 * 3 / 4 * B * 8 / (MBIT * 1e6)
    assert got["predicted_share"] == pytest.approx(0.050 / (4 * 0.050 + OVERHEAD + ring), rel=1e-9)


@pytest.mark.timeout(200)
def test_the_command_writes_the_table_json_and_plot(tmp_path):
    paths = [write(tmp_path, f"bed_{n}r_{link}.json",
                   bed(n, hosts, link, rows=[row("heavy", "sync", [320, 320, 320]),
                                             row("heavy", "hybrid", [512, 448, 576], [[0.5] * 3, [0.6] * 3, [0.7] * 3])]))
             for link in ("10gbit", "1gbit") for n, hosts in ((2, (1, 1)), (4, (2, 2)))]
    model = write(tmp_path, "bed_model.json", {"fit": {"alpha_s": ALPHA, "overhead_s": OVERHEAD, "efficiency": 1.0,
                                                      "hybrid_s": 0.004, "policy_s": None}})
    docs = tmp_path / "docs"
    result = subprocess.run([PYTHON, "-m", "benchmarks.bed_scaling", *paths, f"--constants={model}",
                             f"--docs_dir={docs}"], capture_output=True, text=True, timeout=180, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "| 10gbit | 2 | hybrid | 0.40 (0.35-0.45) |" in result.stdout  # 512 * 0.05 / 64 = 0.4
    assert "| 0.50 | 0.60 | 0.70 | 0.980 (0.970-0.990) | bed_2r_10gbit.json |" in result.stdout
    out = json.loads((docs / "bed_scaling.json").read_text())
    assert [(r["link"], r["ranks"], r["mode"]) for r in out["rows"]][:3] == [("10gbit", 2, "sync"),
                                                                             ("10gbit", 2, "hybrid"),
                                                                             ("10gbit", 4, "sync")]
    assert all(0 < r["predicted_share"] <= 1 for r in out["rows"])
    png = (docs / "bed_scaling.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000
    assert "<!-- bench:bed_scaling:begin -->" in (docs / "BENCHMARKS.md").read_text()


@pytest.mark.timeout(200)
def test_bad_input_is_one_line_with_status_2(tmp_path):
    only_none = write(tmp_path, "none.json", bed(4, (2, 2), rows=[row("none", "sync", [100, 100, 100])]))
    no_fit = write(tmp_path, "model.json", {"rows": []})
    for args, says in (([only_none], "no input has an emulated 'heavy' row"),
                       ([only_none, f"--constants={no_fit}"], "has no fitted constants"),
                       ([only_none, "--straggler=slow"], "'slow' is not a condition"),
                       ([str(tmp_path / "missing.json")], "cannot be read")):
        result = subprocess.run([PYTHON, "-m", "benchmarks.bed_scaling", *args, f"--docs_dir={tmp_path}"],
                                capture_output=True, text=True, timeout=90, env=clean_env(), cwd=REPO)
        assert result.returncode == 2, result.stderr
        errors = [l for l in result.stderr.splitlines() if l.startswith("benchmarks.bed_scaling: error:")]
        assert len(errors) == 1 and says in errors[0], result.stderr
        assert "Traceback" not in result.stderr
    with pytest.raises(bed_rows.BadInput, match="no bed JSON given"):
        bed_scaling.run([], "heavy", None, str(tmp_path))
