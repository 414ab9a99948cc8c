"""``python -m benchmarks.bench_multihost``'s verdict on hybrid across hosts: per round, the
two-host job's median step over the same round's one-host job, the median of those ratios and
the target (1.05) judged on every round."""
from benchmarks import multihost_report


def row(setting, rate, mode, jobs):
    return {"setting": setting, "rate": rate, "mode": mode, "job_medians_ms": jobs}


def test_each_round_is_its_own_two_host_job_over_its_one_host_job():
    results = {"rows": [row("1 host", None, "hybrid", [100.0, 80.0, 90.0]),
                        row("1 host", None, "sync", [50.0, 50.0, 50.0]),
                        row("2 hosts, 100mbit", "100mbit", "sync", [700.0, 700.0, 700.0]),
                        row("2 hosts, 100mbit", "100mbit", "hybrid", [102.0, 84.0, 90.0])]}
    (line,) = multihost_report.hybrid_verdicts(results)
    # 1.02, 1.05, 1.00: the median 1.02 (not 276 / 270 = 1.022), 1.05 is within the target.
    assert line == ("- hybrid, 2 hosts, 100mbit: step over its one-host step 1.020 (each round: 1.020, 1.050, "
                    "1.000); target <= 1.05 in every round: met")
    results["rows"][3]["job_medians_ms"][1] = 84.1  # 1.05125 in one round
    assert multihost_report.hybrid_verdicts(results)[0].endswith("in every round: missed")
