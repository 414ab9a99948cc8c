"""benchmarks.bed_model: the cost model's job of a bed row against formulas written here from the
documented rules (the barrier, the α–β ring, hybrid's rounds, the transient mix), the Pareto
tail against its closed-form expected maximum and NumPy's own sampler, the α/overhead fit on
synthetic points, and the command's bad input."""
import dataclasses
import json
import math
import subprocess

import numpy as np
import pytest

from benchmarks import bed_fit, bed_model, bed_rows
from tests.conftest import PYTHON, REPO, clean_env
from tfsyncmodes import costs

B = 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10  # the bed's MLP: 85,002 parameters...
B *= 4                                                # ...of float32 gradients
ALPHA, OVERHEAD, MBIT, LOOP = 100e-6, 0.010, 20.0, 10e9
WAIT, BATCH = 0.050, 16  # every rank's emulated wait; samples per rank (global batch 64 over 4)


def bed(ranks=4, hosts=(2, 2), rows=(("none", "sync", 100.0),), compute="emulated"):
    return {"ranks": ranks, "hosts": list(hosts), "link": "1gbit", "compute": compute, "measured_mbit_s": MBIT,
            "emulated_step_ms": 50.0, "epochs": 3, "pareto_alpha": 2.0,
            "rows": [{"straggler": s, "mode": m, "samples_per_s": v} for s, m, v in rows]}


def ring(n, bits_per_s, models=1):
    """A ring over n members of `models` gradients at once (hybrid's columns share a host's link)."""
    return 0.0 if n == 1 else 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * models * B * 8 / bits_per_s


def sync_rate(n, slowest):  # the bed's global batch is 64 at every N: 64 / N samples a rank
    return 64 / (slowest + OVERHEAD + ring(n, MBIT * 1e6))


def test_the_job_of_a_bed_row_is_the_bed_as_it_ran_and_sync_is_the_formula():
    small = bed()
    job = bed_rows.job(small, "sync", "persistent", ALPHA, OVERHEAD)
    assert (job.ranks, job.ranks_per_host, job.batch, job.grad_bytes) == (4, 2, BATCH, B)
    assert (job.link_gbit, job.straggler, job.overhead_ms, job.period, job.local_steps) == (0.02, 4, 10.0, 8, "auto")
    # sync: E[max over ranks of compute] + 2 (N-1) α + 2 (N-1)/N B/β
    assert bed_rows.predict(small, "sync", "none", ALPHA, OVERHEAD) == pytest.approx(sync_rate(4, WAIT), rel=1e-12)
    assert bed_rows.predict(small, "sync", "persistent", ALPHA, OVERHEAD) == pytest.approx(sync_rate(4, 4 * WAIT), rel=1e-12)
    # transient: slow in steps [22, 44) of 1437 // 64 * 3 = 66: the time-weighted mix
    share = (44 - 22) / 66
    want = 1 / (share / sync_rate(4, 4 * WAIT) + (1 - share) / sync_rate(4, WAIT))
    assert bed_rows.predict(small, "sync", "transient", ALPHA, OVERHEAD) == pytest.approx(want, rel=1e-12)
    # A window from F to E seconds after the first step (beds since it is in seconds): samples
    # come at r_fast, r_slow inside the window, r_fast after it; the rate measured is over the
    # 2 epochs after the first (epochs of 22 * 64 samples), read off the samples-time curve.
    for window in ([1.1, 2.2], [3.0, 4.0], [0.5, 60.0]):
        timed = dict(small, transient_window_s=window)
        epoch, slow, fast = 22 * 64, sync_rate(4, 4 * WAIT), sync_rate(4, WAIT)
        first, end = window
        times = np.array([0.0, first, end, end + 1e6])
        done = np.cumsum([0.0, fast * first, slow * (end - first), fast * 1e6])
        start, stop = np.interp([epoch, 3 * epoch], done, times)
        want = 2 * epoch / (stop - start)
        assert bed_rows.predict(timed, "sync", "transient", ALPHA, OVERHEAD) == pytest.approx(want, rel=1e-9), window
    heavy = bed_rows.job(small, "sync", "heavy", ALPHA, OVERHEAD)
    assert (heavy.pareto_alpha, heavy.straggler, heavy.tail_sigma) == (2.0, 1.0, 0.0)
    # async: on loopback, each worker its own pace, one ps; an epoch's 1437 // 16 = 89 steps go
    # to the 4 workers in turn and are joined at its end: 23 steps' time for 89 steps' samples.
    per_update = 2 * B * 8 / LOOP + 2 * ALPHA
    closures = 1437 // BATCH
    paced = closures / (-(-closures // 4) * (WAIT + OVERHEAD + per_update))
    assert (closures, paced) == (89, pytest.approx(89 / 92 * 4 / (WAIT + OVERHEAD + per_update)))
    want = min(paced, LOOP / (B * 8)) * BATCH
    assert bed_rows.predict(small, "async", "none", ALPHA, OVERHEAD) == pytest.approx(want, rel=1e-12)
    # async across the namespaces: the shaped link at the fitted efficiency; the ps's link binds
    across = dict(small, async_on="namespaces: the chief and the ps on a host of their own, shaped alike")
    link = 0.9 * MBIT * 1e6
    own = 4 / (WAIT + OVERHEAD + 2 * B * 8 / link + 2 * ALPHA)
    assert link / (B * 8) < own
    got = bed_rows.predict(across, "async", "none", ALPHA, OVERHEAD, efficiency=0.9)
    assert got == pytest.approx(link / (B * 8) * BATCH, rel=1e-12)
    # Two ps on hosts of their own (the file's "ps"), every kernel split over them: each carries
    # half of every pull and push, so the cap doubles, above the workers' own pace: each worker
    # pushes its whole gradient through its own link and, the bed shaping what a host sends only,
    # pulls the two halves at once at the two ps hosts' rate. At steps of twice the wait the
    # workers bind; at the wait itself they would run past the doubled cap.
    two = dict(across, ps=2, emulated_step_ms=2 * WAIT * 1e3)
    own = closures / (-(-closures // 4) * (2 * WAIT + OVERHEAD + B * 8 / link + B * 8 / (2 * link) + 2 * ALPHA))
    assert link / (B * 8) < own < 2 * link / (B * 8)
    assert closures / (-(-closures // 4) * (WAIT + OVERHEAD + B * 8 / link + B * 8 / (2 * link) + 2 * ALPHA)) > (
        2 * link / (B * 8))
    assert bed_rows.predict(dict(across, ps=2), "async", "none", ALPHA, OVERHEAD, efficiency=0.9) == pytest.approx(
        2 * link / (B * 8) * BATCH, rel=1e-12)
    got = bed_rows.predict(two, "async", "none", ALPHA, OVERHEAD, efficiency=0.9)
    assert got == pytest.approx(own * BATCH, rel=1e-12)
    # One ps whose hosts have a link ten times the workers' (--ps_link=100gbit over 10gbit):
    # its cap is ten times as high and the workers bind. The bed shapes what a host sends only,
    # so a worker pushes at its own link's rate and pulls at the ps host's.
    fast_ps = dict(across, link="10gbit", ps_link="100gbit")
    fast_job = bed_rows.job(fast_ps, "async", "none", ALPHA, OVERHEAD, efficiency=0.9)
    assert (fast_job.ps_gbit, fast_job.down_gbit) == (pytest.approx(10 * link / 1e9), LOOP / 1e9)
    assert bed_rows.job(across, "async", "none", ALPHA, OVERHEAD, efficiency=0.9).ps_gbit == pytest.approx(link / 1e9)
    own = closures / (-(-closures // 4) * (WAIT + OVERHEAD + B * 8 / link + B * 8 / (10 * link) + 2 * ALPHA))
    assert own < 10 * link / (B * 8)
    got = bed_rows.predict(fast_ps, "async", "none", ALPHA, OVERHEAD, efficiency=0.9)
    assert got == pytest.approx(own * BATCH, rel=1e-12)


HYBRID = 0.004  # hybrid's own per-step cost in these tests


def test_hybrid_fixed_and_auto_with_a_persistent_straggler_are_the_round_formulas():
    """2 ranks a host on loopback, 2 hosts on the link: each round's average runs in 2 columns
    at once (2 gradients on the link), the plan's allgather over 4 ranks adds 3 α; an epoch of
    1437 // 64 = 22 steps ends after 3 rounds of the fast group (22/3 steps a round)."""
    small = bed()
    inner, cross = ring(2, LOOP), ring(2, MBIT * 1e6, models=2)
    fast, slow = WAIT + OVERHEAD + HYBRID + inner, 4 * WAIT + OVERHEAD + HYBRID + inner
    job = bed_rows.job(small, "hybrid", "persistent", ALPHA, OVERHEAD, hybrid_s=HYBRID)
    assert (job.epoch_steps, job.hybrid_overhead_ms) == (22, pytest.approx(4.0))
    fixed = costs.predict(dataclasses.replace(job, local_steps="fixed"))["hybrid"]
    assert fixed == pytest.approx(8 * 4 * BATCH / (8 * slow + cross), rel=1e-12)
    steps = max(1, round(8 * fast / slow))  # the slow group's steps a round
    want = (22 / 3 + steps) * 2 * BATCH / (max(22 / 3 * fast, steps * slow) + cross + 3 * ALPHA)
    got = bed_rows.predict(small, "hybrid", "persistent", ALPHA, OVERHEAD, hybrid_s=HYBRID)
    assert got == pytest.approx(want, rel=1e-12)
    none = bed_rows.predict(small, "hybrid", "none", ALPHA, OVERHEAD, hybrid_s=HYBRID)
    assert none == pytest.approx(22 / 3 * 4 * BATCH / (22 / 3 * fast + cross + 3 * ALPHA), rel=1e-12)


def test_hybrids_transient_row_is_simulated_round_by_round_on_the_runs_time_line():
    """A window after the run's end: the undisturbed rounds (8, 8, 6 steps of both groups an
    epoch, then the average and the plan's allgather), exactly; a window over the whole run:
    the slow group's rounds after the plan has learnt its speed, near the closed form of the
    persistent straggler (which averages the epoch's rounds: 3 %); a window in the middle
    lies between the two, below their time-weighted mix. (The bed rates a run by its mean samples an epoch: the first epoch's
    extra slow-group steps, planned before any was timed, count in it; 6 epochs keep that small.)"""
    small = dict(bed(), epochs=6)
    inner, cross = ring(2, LOOP), ring(2, MBIT * 1e6, models=2) + 3 * ALPHA
    fast = WAIT + OVERHEAD + HYBRID + inner
    after = bed_rows.predict(dict(small, transient_window_s=[1e5, 2e5]), "hybrid", "transient", ALPHA, OVERHEAD,
                              hybrid_s=HYBRID)
    assert after == pytest.approx(22 * 4 * BATCH / (22 * fast + 3 * cross), rel=1e-9)
    whole = bed_rows.predict(dict(small, transient_window_s=[0.0, 1e5]), "hybrid", "transient", ALPHA, OVERHEAD,
                              hybrid_s=HYBRID)
    persistent = bed_rows.predict(small, "hybrid", "persistent", ALPHA, OVERHEAD, hybrid_s=HYBRID)
    assert whole == pytest.approx(persistent, rel=0.03)
    timed = dict(small, transient_window_s=[3.0, 12.0])
    middle = bed_rows.predict(timed, "hybrid", "transient", ALPHA, OVERHEAD, hybrid_s=HYBRID)
    assert whole < middle < after
    # The plan lags the window: its first rounds inside run the slow group's fast-time plan (the
    # fast group waits), its first rounds after it the slow-time plan. Below the time-weighted
    # mix of the two rates (the model before the simulation) by 5 % or more here.
    assert middle < 0.95 * bed_rows.transient_rate(timed, persistent, after)


def test_hybrids_own_step_cost_is_fitted_on_rows_of_one_rank_per_host_only():
    """A bed of 2 hosts of one rank: a hybrid row whose rate is the formula at 7 ms of hybrid's
    own cost gives back 7 ms; rows with 2 ranks a host, or a straggler, are not fitted on."""
    cross = ring(2, MBIT * 1e6) + ALPHA  # one column; the allgather over 2 ranks: 1 α
    rate = 22 / 3 * 2 * 32 / (22 / 3 * (WAIT + OVERHEAD + 0.007) + cross)  # 32 samples a rank
    two = bed(ranks=2, hosts=(1, 1), rows=(("none", "hybrid", rate), ("persistent", "hybrid", rate / 2)))
    constants = {"alpha_s": ALPHA, "overhead_s": OVERHEAD}
    assert bed_model.fit_hybrid([two], constants) == pytest.approx(0.007, rel=1e-6)
    assert [bed_model.hybrid_calibration(two, r) for r in two["rows"]] == [True, False]
    four = bed(rows=(("none", "hybrid", 500.0),))
    assert bed_model.fit_hybrid([four], constants) is None and not bed_model.hybrid_calibration(four, four["rows"][0])


def test_a_pareto_tail_has_mean_one_and_the_closed_form_expected_maximum():
    alpha, n = 3.0, 16
    job = costs.Job(ranks=n, step_ms=WAIT * 1e3, overhead_ms=OVERHEAD * 1e3, grad_mb=1.0, link_gbit=1.0,
                    pareto_alpha=alpha, latency_us=0.0, batch=BATCH)
    times = costs.compute_seconds(job)
    scale = (alpha - 1) / alpha
    want_max = scale * n * math.gamma(n) * math.gamma(1 - 1 / alpha) / math.gamma(n + 1 - 1 / alpha)
    assert times.min() >= WAIT * scale + OVERHEAD - 1e-15
    assert (times.mean() - OVERHEAD) / WAIT == pytest.approx(1.0, rel=0.01)
    assert (times.max(axis=1).mean() - OVERHEAD) / WAIT == pytest.approx(want_max, rel=0.03)
    numpy_draws = (np.random.default_rng(7).pareto(alpha, size=(200_000, n)) + 1) * scale  # NumPy's Lomax + 1
    assert numpy_draws.max(axis=1).mean() == pytest.approx(want_max, rel=0.01)
    sync = costs.predict(job)["sync"]
    assert sync == pytest.approx(n * BATCH / (WAIT * want_max + OVERHEAD + ring_free(n)), rel=0.03)
    with pytest.raises(ValueError, match="pareto_alpha=1.0: use 0 \\(none\\) or > 1"):
        costs.Job(ranks=2, step_ms=1, grad_mb=1, link_gbit=1, pareto_alpha=1.0)


def ring_free(n):  # the α-free ring of 1 MB on 1 Gbit/s
    return 2 * (n - 1) / n * 1e6 * 8 / 1e9


def test_the_fit_recovers_alpha_and_overhead_and_says_when_it_cannot():
    hops = np.array([2, 6, 14, 6, 2])
    got = bed_fit.fit(hops, 0.0123 + hops * 37e-6, fixed_alpha_s=50e-6)
    assert got["alpha_s"] == pytest.approx(37e-6, rel=1e-6) and got["overhead_s"] == pytest.approx(0.0123, rel=1e-6)
    one = bed_fit.fit([6, 6], [0.0123 + 6 * 37e-6] * 2, fixed_alpha_s=50e-6)
    assert one["alpha_s"] == 50e-6 and one["overhead_s"] == pytest.approx(0.0123 + 6 * 37e-6 - 6 * 50e-6, rel=1e-9)
    assert one["note"].startswith("too few points to fit α")


def test_the_fit_recovers_the_links_efficiency_relative_to_each_step_and_holds_a_negative_term_at_0():
    """Rows at three link rates: y = overhead + hops α + bytes / efficiency, residuals weighed by
    1 / step. The reference solves the weighted normal equations by hand (Cramer's rule)."""
    hops = np.array([2.0, 6.0, 6.0, 6.0, 2.0, 14.0])
    data = np.array([0.004, 0.005, 0.05, 0.5, 0.04, 0.06])  # bytes at the measured rate, 3 links
    y = 0.0045 + hops * 1.4e-3 + data / 0.93
    got = bed_fit.fit(hops, y, 50e-6, steps=y + 0.05, data=data)
    assert got["efficiency"] == pytest.approx(0.93, rel=1e-6) and got["alpha_s"] == pytest.approx(1.4e-3, rel=1e-6)
    assert got["overhead_s"] == pytest.approx(0.0045, rel=1e-6) and got["rms_relative"] < 1e-9
    noisy = y * (1 + np.array([0.03, -0.02, 0.05, -0.04, 0.01, 0.02]))
    w = 1 / (noisy + 0.05)
    cols = [w, w * hops, w * data]
    gram = np.array([[a @ b for b in cols] for a in cols])
    rhs = np.array([a @ (w * noisy) for a in cols])
    det = np.linalg.det(gram)
    want = [np.linalg.det(np.column_stack([rhs if j == i else gram[:, j] for j in range(3)])) / det for i in range(3)]
    got = bed_fit.fit(hops, noisy, 50e-6, steps=noisy + 0.05, data=data)
    assert [got["overhead_s"], got["alpha_s"], 1 / got["efficiency"]] == pytest.approx(want, rel=1e-6)
    held = bed_fit.fit(hops, hops * 1.4e-3 + data / 0.93 - 0.002, 50e-6, data=data)  # overhead < 0
    a = np.column_stack([hops, data])  # the two-term normal equations, unweighted
    want = np.linalg.solve(a.T @ a, a.T @ (hops * 1.4e-3 + data / 0.93 - 0.002))
    assert held["overhead_s"] == 0 and [held["alpha_s"], 1 / held["efficiency"]] == pytest.approx(want, rel=1e-9)
    assert "overhead < 0 fitted, held at 0" in held["note"]


@pytest.mark.timeout(200)
def test_the_command_fits_sync_rows_of_three_beds_and_writes_the_table(tmp_path):
    paths = []
    for ranks, hosts in ((2, (1, 1)), (4, (2, 2)), (8, (2, 2, 2, 2))):
        rows = [("none", "sync", sync_rate(ranks, WAIT)), ("persistent", "sync", sync_rate(ranks, 4 * WAIT)),
                ("none", "hybrid", 300.0), ("none", "policy", 250.0)]
        written = bed(ranks, hosts, rows)
        for row in written["rows"][:2]:  # the steady rate (after the first epoch) is what the model prices
            row["steady_samples_per_s"], row["samples_per_s"] = row["samples_per_s"], row["samples_per_s"] / 2
        paths.append(tmp_path / f"bed_{ranks}r_1gbit.json")
        paths[-1].write_text(json.dumps(written))
    result = subprocess.run([PYTHON, "-m", "benchmarks.bed_model", *map(str, paths)], capture_output=True, text=True,
                            timeout=180, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr
    out = json.loads((tmp_path / "bed_model.json").read_text())
    assert out["fit"]["alpha_s"] == pytest.approx(ALPHA, rel=1e-6)
    assert out["fit"]["overhead_s"] == pytest.approx(OVERHEAD, rel=1e-6)
    assert len(out["rows"]) == 12 and [r["within"] for r in out["rows"] if r["mode"] == "sync"] == [True] * 6
    # The policy priced at 2 and 4 ranks (its two groups are the hosts), not at 8 on hosts of 2: still listed.
    policy = [r["predicted"] for r in out["rows"] if r["mode"] == "policy"]
    assert policy[0] > 0 and policy[1] > 0 and policy[2] is None
    assert all(abs(r["error"]) < 1e-6 for r in out["rows"] if r["mode"] == "sync")
    assert "| 8 | 1gbit | none | hybrid |" in result.stdout and "| 300 * |" in result.stdout
    assert "<!-- bench:bed_model:begin -->" in (tmp_path / "BENCHMARKS.md").read_text()


def test_a_held_out_file_fits_nothing_and_is_priced_by_the_others_constants(tmp_path):
    paths = []
    for ranks, hosts, off in ((2, (1, 1), 1.0), (4, (2, 2), 1.0), (8, (2, 2, 2, 2), 0.5)):
        rows = [("none", "sync", off * sync_rate(ranks, WAIT)), ("persistent", "sync", off * sync_rate(ranks, 4 * WAIT))]
        paths.append(tmp_path / f"bed_{ranks}r_1gbit.json")
        paths[-1].write_text(json.dumps(bed(ranks, hosts, rows)))
    settings = dataclasses.replace(bed_rows.DEFAULT, holdout=("bed_8r_1gbit.json",))
    text = bed_model.run(list(map(str, paths)), settings)
    out = json.loads((tmp_path / "bed_model.json").read_text())
    # 2 and 4 ranks alone give the constants: the 8-rank rows, at half the formula's rate, move nothing.
    assert [out["fit"]["alpha_s"], out["fit"]["overhead_s"]] == pytest.approx([ALPHA, OVERHEAD], rel=1e-6)
    eight = [r for r in out["rows"] if r["ranks"] == 8]
    assert [r["fitted"] for r in eight] == [False, False]
    assert [r["error"] for r in eight] == pytest.approx([1.0, 1.0], rel=1e-6)  # the formula's rate / half of it
    assert "--holdout=bed_8r_1gbit.json" in text and "validation rows (sync 0 of 2)" in text
    with pytest.raises(bed_rows.BadInput, match="--holdout: bed_16r.json is not among the input files"):
        bed_model.run(list(map(str, paths)), dataclasses.replace(settings, holdout=("bed_16r.json",)))
    with pytest.raises(bed_rows.BadInput, match="every input file is held out"):
        bed_model.run([str(paths[-1])], settings)


@pytest.mark.timeout(200)
def test_bad_input_is_one_line_with_status_2(tmp_path):
    norows = tmp_path / "norows.json"
    norows.write_text(json.dumps({"ranks": 4}))
    for path, says in ((tmp_path / "missing.json", "cannot be read"), (norows, "has no rows")):
        result = subprocess.run([PYTHON, "-m", "benchmarks.bed_model", str(path)], capture_output=True, text=True,
                                timeout=90, env=clean_env(), cwd=REPO)
        assert result.returncode == 2, result.stderr
        errors = [l for l in result.stderr.splitlines() if l.startswith("benchmarks.bed_model: error:")]
        assert len(errors) == 1 and says in errors[0] and str(path) in errors[0], result.stderr
        assert "Traceback" not in result.stderr


def test_a_sync_row_is_a_fit_point_of_its_step_less_waits_with_its_bytes_term_apart():
    """y = measured step - the slowest rank's wait, with the ring's bytes at the measured rate
    beside it; a transient row's wait is the slow one for the share of its steps the window can
    hold (W / slow wait of N / 64)."""
    small = dict(bed(rows=()), transient_window_s=[1.1, 2.2])
    data = 2 * 3 / 4 * B * 8 / (MBIT * 1e6)
    got = bed_model.sync_point(small, {"straggler": "none", "mode": "sync", "samples_per_s": 400.0})
    assert got == (6, pytest.approx(64 / 400.0 - WAIT, rel=1e-9), pytest.approx(64 / 400.0), pytest.approx(data))
    share = 1.1 / (4 * WAIT) / (2 * 22 * 64 / 64)
    hops, y, step, bytes_term = bed_model.sync_point(small, {"straggler": "transient", "mode": "sync",
                                                             "samples_per_s": 300.0})
    want = 64 / 300.0 - (share * 4 * WAIT + (1 - share) * WAIT)
    assert (hops, y, step, bytes_term) == (6, pytest.approx(want, rel=1e-9), pytest.approx(64 / 300.0),
                                           pytest.approx(data))
    assert bed_model.sync_point(small, {"straggler": "none", "mode": "hybrid", "samples_per_s": 1.0}) is None


def pareto_draws(alpha, seed, ranks, steps):
    """What the trainer's emulated compute draws, as its doc says: TensorFlow's stateless uniform
    U seeded by (seed, rank * 2**32 + step), then the Pareto of mean 1, (a-1)/a * (1-U)^(-1/a)."""
    import tensorflow as tf

    out = np.empty((steps, ranks))
    for rank in range(ranks):
        for step in range(steps):
            key = tf.constant([seed, rank * (1 << 32) + step], tf.int64)
            u = float(tf.random.stateless_uniform([], seed=key, dtype=tf.float64))
            out[step, rank] = (alpha - 1) / alpha * (1 - u) ** (-1 / alpha)
    return out


def test_a_heavy_row_replays_the_draws_of_the_measured_epochs_and_sync_waits_for_each_steps_largest():
    small = dict(bed(), seed=5)  # 3 epochs of 22 steps: the measured rate spans steps 22-65
    draws = pareto_draws(2.0, 5, 4, 66)[22:]
    assert bed_rows.run_delays(small, "heavy") == pytest.approx(draws, rel=1e-12)
    want = 64 / ((WAIT * draws).max(axis=1).mean() + OVERHEAD + ring(4, MBIT * 1e6))
    assert bed_rows.predict(small, "sync", "heavy", ALPHA, OVERHEAD) == pytest.approx(want, rel=1e-12)
    # drawn afresh instead: the distribution's expectation, not this run's
    fresh = bed_rows.predict(small, "sync", "heavy", ALPHA, OVERHEAD, bed_rows.Settings(replay_draws=False))
    assert fresh == pytest.approx(costs.predict(bed_rows.job(small, "sync", "heavy", ALPHA, OVERHEAD))["sync"])
    assert abs(fresh / want - 1) > 0.01
    for condition in ("none", "persistent", "transient"):
        assert bed_rows.run_delays(small, condition) is None
    # the fit's sync point of a heavy row takes the same waits
    point = bed_model.sync_point(small, {"mode": "sync", "straggler": "heavy", "samples_per_s": 100.0})
    assert point[1] == pytest.approx(64 / 100.0 - (WAIT * draws).max(axis=1).mean(), rel=1e-12)


def test_the_policys_rows_are_simulated_and_its_own_cost_is_fitted_on_its_rows_without_a_straggler():
    """The straggler policy (benchmarks.bed_rows.policy_rate): with no straggler it stays in
    sync, so its row is sync's formula with its own cost added to every step, and a row at that
    rate gives the cost back; with a persistent straggler it leaves sync in the first epoch and
    runs at hybrid's pace (its own cost 0 here), far above sync's. Rated as the bed rates a run
    (its mean samples an epoch), the first epoch's sync steps, all of them done by both groups,
    lift it up to 15 % above hybrid's."""
    six = dict(bed(rows=(("none", "policy", 64 / (WAIT + OVERHEAD + 0.004 + ring(4, MBIT * 1e6))),
                         ("persistent", "policy", 100.0))), epochs=6)
    steady = bed_rows.predict(six, "policy", "none", ALPHA, OVERHEAD, policy_s=0.004)
    assert steady == pytest.approx(six["rows"][0]["samples_per_s"], rel=1e-9)
    constants = {"alpha_s": ALPHA, "overhead_s": OVERHEAD}
    assert bed_model.fit_policy([six], constants) == pytest.approx(0.004, rel=1e-6)
    assert [bed_model.policy_calibration(six, r) for r in six["rows"]] == [True, False]
    policy = bed_rows.predict(six, "policy", "persistent", ALPHA, OVERHEAD, hybrid_s=HYBRID)
    hybrid = bed_rows.predict(six, "hybrid", "persistent", ALPHA, OVERHEAD, hybrid_s=HYBRID)
    sync = bed_rows.predict(six, "sync", "persistent", ALPHA, OVERHEAD)
    assert 0.95 * hybrid < policy < 1.15 * hybrid and policy > 1.5 * sync


def test_the_policys_rows_are_priced_at_the_patience_their_file_ran_with():
    """A file's patience: a --sync_switch_patience among its extra flags, else the default it
    recorded, else 2 (the default before it was recorded). One window of patience leaves sync a
    window sooner after a straggler comes, so the rest of the run goes at hybrid's pace sooner."""
    old = dict(bed(rows=(("transient", "policy", 100.0),)), epochs=6, transient_window_s=[5.0, 1e9])
    assert bed_rows.switch_patience(old) == 2
    assert bed_rows.switch_patience(dict(old, switch_patience=1)) == 1
    assert bed_rows.switch_patience(dict(old, switch_patience=1, extra_flags="--seed=1 --sync_switch_patience=3")) == 3
    one, two = (bed_rows.predict(dict(old, switch_patience=p), "policy", "transient", ALPHA, OVERHEAD, hybrid_s=HYBRID)
                for p in (1, 2))
    assert one > 1.05 * two
    assert bed_rows.predict(old, "policy", "transient", ALPHA, OVERHEAD, hybrid_s=HYBRID) == pytest.approx(two, rel=1e-12)
