"""The cost model (tfsyncmodes.costs) against closed forms written here from its documented
rules (α–β ring allreduce, the barrier, the ps links, hybrid's rounds), and against an
independent sampling of the heavy tail; `python -m tfsyncmodes.advise` and its bad input."""
import subprocess

import numpy as np
import pytest

from tests import reference
from tests.conftest import PYTHON, REPO, clean_env
from tfsyncmodes import costs, simulate

T, B, GBIT, ALPHA, BATCH = 0.05, 4e6, 10.0, 50e-6, 64


def ring(n, gbit, models=1):
    """A ring allreduce over n members of `models` gradients at once (hybrid's columns: every
    rank of a host averages with its peers of the other hosts at the same time)."""
    return 0.0 if n == 1 else 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * models * B * 8 / (gbit * 1e9)


def gather(n, gbit):
    """A ring allgather of B bytes in all over n members (a slice from each)."""
    return 0.0 if n == 1 else (n - 1) * ALPHA + (n - 1) / n * B * 8 / (gbit * 1e9)


# Hybrid's average across the 4 hosts of 2 ranks: each column its slice (one model on a host's
# link in all), then the host gathers the two slices.
CROSS = ring(4, GBIT) + gather(2, 100.0)


def job(**kw):
    base = dict(ranks=8, ranks_per_host=2, step_ms=T * 1e3, grad_mb=B / 1e6, link_gbit=GBIT, host_gbit=100.0,
                latency_us=ALPHA * 1e6, batch=BATCH, period=8)
    return costs.Job(**dict(base, **kw))


def test_async_is_bound_by_what_the_servers_links_carry_each_way():
    """At 1 Gbit/s the 8 workers would run 8 / (T + 2B/β) updates a second; the servers' links
    carry B out and B in an update, one direction each: ps β / B updates a second at most."""
    for ps in (1, 2):
        got = costs.predict(job(link_gbit=1.0, ps=ps))["async"]
        own = 8 / (T + 2 * B * 8 / 1e9 + 2 * ALPHA)
        assert ps * 1e9 / (B * 8) < own  # the links bind
        assert got == pytest.approx(ps * 1e9 / (B * 8) * BATCH, rel=1e-12)


def test_a_servers_faster_link_lifts_the_cap_and_not_a_workers_pace():
    """A server on a link ten times the workers' (``ps_gbit``) carries ten times the updates;
    the 8 workers at 1 Gbit/s then run at their own pace, their pulls and pushes at 1 Gbit/s."""
    own = 8 / (T + 2 * B * 8 / 1e9 + 2 * ALPHA)
    assert 1e9 / (B * 8) < own < 10e9 / (B * 8)
    assert costs.predict(job(link_gbit=1.0, ps_gbit=10.0))["async"] == pytest.approx(own * BATCH, rel=1e-12)
    assert costs.predict(job(link_gbit=1.0, ps_gbit=1.0))["async"] == pytest.approx(1e9 / (B * 8) * BATCH, rel=1e-12)
    with pytest.raises(ValueError, match="ps_gbit"):
        job(ps_gbit=-1.0)


def test_a_worker_pulls_at_the_slower_of_its_incoming_link_and_the_servers():
    """A symmetric link (``down_gbit`` 0) carries a worker's pull and push at its own rate
    from a server as fast or faster; a link that limits only what a host sends (incoming
    100 Gbit/s) lets it pull at the server's 10; a server slower than the worker's link gives
    the pull its rate, and two such servers, each sending its half at once, twice it."""
    assert costs.async_update_seconds(job(link_gbit=1.0, ps_gbit=10.0)) == pytest.approx(
        2 * B * 8 / 1e9 + 2 * ALPHA, rel=1e-12)
    egress_only = job(link_gbit=1.0, ps_gbit=10.0, down_gbit=100.0)
    assert costs.async_update_seconds(egress_only) == pytest.approx(B * 8 / 1e9 + B * 8 / 10e9 + 2 * ALPHA, rel=1e-12)
    assert costs.async_update_seconds(job(link_gbit=10.0, ps_gbit=1.0)) == pytest.approx(
        B * 8 / 10e9 + B * 8 / 1e9 + 2 * ALPHA, rel=1e-12)
    assert costs.async_update_seconds(job(link_gbit=10.0, ps_gbit=1.0, ps=2)) == pytest.approx(
        B * 8 / 10e9 + B * 8 / 2e9 + 2 * ALPHA, rel=1e-12)
    own = 8 / (T + B * 8 / 1e9 + B * 8 / 10e9 + 2 * ALPHA)  # the 8 workers' own pace, under the cap
    assert own < 10e9 / (B * 8)
    assert costs.predict(egress_only)["async"] == pytest.approx(own * BATCH, rel=1e-12)
    with pytest.raises(ValueError, match="down_gbit"):
        job(down_gbit=-1.0)


def test_a_workers_pull_and_push_pass_its_own_link_whole_however_many_servers():
    """More servers lift the servers' cap, not a worker's own pace: its link carries all of B
    in and out (at 8 servers, 8 workers at 10 Gbit/s run at their own pace)."""
    got = costs.predict(job(link_gbit=10.0, ps=8))["async"]
    own = 8 / (T + 2 * B * 8 / 10e9 + 2 * ALPHA)
    assert own < 8 * 10e9 / (B * 8)  # the workers bind
    assert got == pytest.approx(own * BATCH, rel=1e-12)


def test_without_tails_or_stragglers_each_mode_is_its_closed_form():
    got = costs.predict(job(local_steps="fixed"))
    assert got["sync"] == pytest.approx(8 * BATCH / (T + ring(8, GBIT)), rel=1e-12)
    per_update = 2 * B * 8 / (GBIT * 1e9) + 2 * ALPHA
    assert got["async"] == pytest.approx(min(8 / (T + per_update), GBIT * 1e9 / (B * 8)) * BATCH, rel=1e-12)
    round_time = 8 * (T + ring(2, 100.0)) + CROSS
    assert got["hybrid"] == pytest.approx(8 * BATCH * 8 / round_time, rel=1e-12)
    # Each column with the whole model (as before 0.2.0): 2 models on a host's link.
    whole = costs.predict(job(local_steps="fixed", hybrid_slices=False))["hybrid"]
    assert whole == pytest.approx(8 * BATCH * 8 / (8 * (T + ring(2, 100.0)) + ring(4, GBIT, models=2)), rel=1e-12)
    # With equal ranks, speed-proportional steps are the fixed plan, and every round also
    # allgathers the plan's figures over all 8 ranks (7 latencies).
    auto = costs.predict(job(local_steps="auto"))["hybrid"]
    assert auto == pytest.approx(8 * BATCH * 8 / (round_time + 7 * ALPHA), rel=1e-12)
    # The step's own bookkeeping adds to every step of every group.
    slower = costs.predict(job(local_steps="fixed", hybrid_overhead_ms=3.0))["hybrid"]
    assert slower == pytest.approx(8 * BATCH * 8 / (round_time + 8 * 0.003), rel=1e-12)


def test_a_persistent_straggler_holds_sync_back_and_auto_local_steps_route_around_it():
    got = costs.predict(job(straggler=4.0, local_steps="auto"))
    assert got["sync"] == pytest.approx(8 * BATCH / (4 * T + ring(8, GBIT)), rel=1e-12)
    fast, slow = T + ring(2, 100.0), 4 * T + ring(2, 100.0)
    slow_steps = reference.speed_shares([fast, fast, fast, slow], 8)[3]  # the trainer's plan
    round_time = max(8 * fast, slow_steps * slow) + CROSS + 7 * ALPHA
    assert got["hybrid"] == pytest.approx((3 * 8 + slow_steps) * 2 * BATCH / round_time, rel=1e-12)
    fixed = costs.predict(job(straggler=4.0, local_steps="fixed"))["hybrid"]
    assert fixed == pytest.approx(8 * 8 * BATCH / (8 * slow + CROSS), rel=1e-12)
    assert got["hybrid"] > 2 * fixed
    assert costs.best(got) == "async"  # one slow worker costs async only its own share


def test_an_epoch_that_does_not_divide_into_rounds_makes_the_fastest_groups_rounds_shorter():
    """22 steps an epoch at period 8: every group ends the epoch at the round where the fastest
    has run its 22 steps, in 3 rounds (8, 8, 6): 22/3 steps a round. A group planned fewer steps
    than that keeps its plan."""
    got = costs.predict(job(epoch_steps=22, local_steps="auto"))["hybrid"]
    step = T + ring(2, 100.0)
    cross = CROSS + 7 * ALPHA
    assert got == pytest.approx(4 * (22 / 3) * 2 * BATCH / (22 / 3 * step + cross), rel=1e-12)
    slow = costs.predict(job(epoch_steps=22, straggler=4.0, local_steps="auto"))["hybrid"]
    fast, slower = step, 4 * T + ring(2, 100.0)
    slow_steps = reference.speed_shares([fast, fast, fast, slower], 8)[3]
    assert slow_steps < 22 / 3
    want = (3 * 22 / 3 + slow_steps) * 2 * BATCH / (max(22 / 3 * fast, slow_steps * slower) + cross)
    assert slow == pytest.approx(want, rel=1e-12)


def test_a_round_waits_for_the_group_whose_steps_added_up_longest():
    """With a heavy tail each group's round is a sum of its own steps; the round ends with the
    largest sum, which is longer on average than the largest expected sum. Reference: a NumPy
    simulation of its own (another seed, 50x the rounds) of 4 hosts of 2 ranks, 8 steps a round."""
    sigma = 0.5
    got = costs.predict(job(tail_sigma=sigma, local_steps="auto"))["hybrid"]
    rng = np.random.default_rng(2024)
    rounds = 100_000
    delays = rng.lognormal(-sigma ** 2 / 2, sigma, size=(rounds, 8, 4, 2))  # round, step, host, rank
    group_steps = T * delays.max(axis=3) + ring(2, 100.0)                     # a group waits for its slowest
    round_time = group_steps.sum(axis=1).max(axis=1).mean() + CROSS + 7 * ALPHA
    assert got == pytest.approx(8 * 8 * BATCH / round_time, rel=0.02)
    # Without the wait (the slowest expected sum alone) the model would be 5 % or more faster.
    no_wait = 8 * 8 * BATCH / (8 * group_steps.mean() + CROSS + 7 * ALPHA)
    assert no_wait > 1.05 * got


def test_a_heavy_tail_costs_sync_the_expected_maximum_of_its_ranks():
    sigma = 0.5
    got = costs.predict(job(tail_sigma=sigma, ranks_per_host=1, ranks=16))
    rng = np.random.default_rng(12345)  # not the model's seed, and 50x its samples
    delays = rng.lognormal(-sigma ** 2 / 2, sigma, size=(200_000, 16))
    assert delays.mean() == pytest.approx(1.0, abs=0.01)
    want = 16 * BATCH / (T * delays.max(axis=1).mean() + ring(16, GBIT))
    assert got["sync"] == pytest.approx(want, rel=0.02)
    # The tail costs sync more the more ranks wait for each other.
    ratios = [costs.predict(job(tail_sigma=sigma, ranks=n, ranks_per_host=1))["sync"]
              / costs.predict(job(ranks=n, ranks_per_host=1))["sync"] for n in (2, 8, 32)]
    assert ratios[0] > ratios[1] > ratios[2]


def test_a_job_the_model_cannot_price_is_refused_by_name():
    with pytest.raises(ValueError, match="ranks_per_host=3: use a divisor of ranks"):
        job(ranks_per_host=3)
    with pytest.raises(ValueError, match="local_steps='sometimes'"):
        job(local_steps="sometimes")


@pytest.mark.timeout(200)
def test_advise_prints_each_mode_and_the_pick_and_bad_input_is_one_line():
    command = [PYTHON, "-m", "tfsyncmodes.advise", "--ranks=8", "--ranks_per_host=2", "--step_ms=50",
               "--grad_mb=4", "--link_gbit=10", "--straggler=4"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=90, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert [l.split()[0] for l in lines[1:4]] == ["sync", "async", "hybrid"]
    assert lines[-1].startswith("highest throughput: async")
    bad = subprocess.run(command[:3] + ["--ranks_per_host=3"], capture_output=True, text=True, timeout=90,
                         env=clean_env(), cwd=REPO)
    assert bad.returncode == 2
    errors = [l for l in bad.stderr.splitlines() if l.startswith("tfsyncmodes: error:")]
    assert errors == ["tfsyncmodes: error: flag: --ranks_per_host: ranks_per_host=3 is not accepted; "
                      "use a divisor of ranks"], bad.stderr
    bad = subprocess.run(command + ["--ps_gbit=-1"], capture_output=True, text=True, timeout=90, env=clean_env(),
                         cwd=REPO)
    errors = [l for l in bad.stderr.splitlines() if l.startswith("tfsyncmodes: error:")]
    assert (bad.returncode, errors) == (2, ["tfsyncmodes: error: flag: --ps_gbit: ps_gbit=-1.0 is not accepted; "
                                            "use >= 0 (0: link_gbit)"]), bad.stderr
    bad = subprocess.run(command + ["--down_gbit=-2"], capture_output=True, text=True, timeout=90, env=clean_env(),
                         cwd=REPO)
    errors = [l for l in bad.stderr.splitlines() if l.startswith("tfsyncmodes: error:")]
    assert (bad.returncode, errors) == (2, ["tfsyncmodes: error: flag: --down_gbit: down_gbit=-2.0 is not accepted; "
                                            "use >= 0 (0: link_gbit)"]), bad.stderr


def test_a_replayed_trace_of_delays_is_priced_as_it_was_drawn_and_a_bad_one_is_refused():
    """`delays`: the per-step factors one run drew, in place of fresh draws: sync waits each
    step for that step's largest, an async worker runs at its own mean, hybrid's groups of a
    host at their own largest."""
    rng = np.random.default_rng(3)
    trace = 0.5 + rng.random((40, 8)) * 3  # (steps, ranks), any positive factors
    flat = job(ranks=8, ranks_per_host=1, local_steps="fixed", period=4)
    got = costs.predict(flat, trace)
    step = (T * trace).max(axis=1).mean() + ring(8, GBIT)
    assert got["sync"] == pytest.approx(8 * BATCH / step, rel=1e-12)
    per_update = 2 * B * 8 / (GBIT * 1e9) + 2 * ALPHA
    assert got["async"] == pytest.approx(BATCH * (1 / ((T * trace).mean(axis=0) + per_update)).sum(), rel=1e-12)
    rounds = (T * trace).reshape(10, 4, 8).sum(axis=1).max(axis=1).mean()  # 10 rounds of 4 steps, slowest host
    assert got["hybrid"] == pytest.approx(8 * BATCH * 4 / (rounds + ring(8, GBIT)), rel=1e-12)
    assert got != costs.predict(flat)  # not the distribution's (no tail: every factor 1)
    for bad in (trace[:, :7], trace[0], trace[:0], -trace):
        with pytest.raises(ValueError, match=r"delays of shape .*: use a \(steps, 8\) array of factors > 0"):
            costs.predict(flat, bad)


def _two_hosts(**kw):
    """Two hosts of one rank, 4 steps a round, epochs of 8 steps, 100 ms steps; the round's
    average costs C (1 MB over 8 Gbit/s, no latency)."""
    base = dict(ranks=2, ranks_per_host=1, step_ms=100.0, grad_mb=1.0, link_gbit=8.0, host_gbit=100.0,
                latency_us=0.0, batch=BATCH, period=4, epoch_steps=8, local_steps="auto")
    return costs.Job(**dict(base, **kw))


C = 1e6 * 8 / 8e9


def test_hybrid_rounds_simulated_follow_the_plan_worked_by_hand():
    """Hand-worked: rank 0 twice as slow throughout. Round 1: both run 4 (no plan yet), 0.8 s
    (the slow one's 4 x 0.2) + C; its average is 0.2 s, so its plan is round(4 x 0.1 / 0.2) = 2;
    round 2: 2 and 4 steps (0.4 s + C); the fast one has run the epoch's 8 steps, so the epoch
    ends with 6 + 8 steps. Every later epoch: two rounds of 2 and 4 steps (0.4 s + C each)."""
    ends, samples = simulate.hybrid_epochs(_two_hosts(straggler=2.0), epochs=3)
    np.testing.assert_allclose(ends, [1.2 + 2 * C, 2.0 + 4 * C, 2.8 + 6 * C], rtol=1e-9)
    np.testing.assert_array_equal(samples, [14 * BATCH, 12 * BATCH, 12 * BATCH])


def test_hybrid_rounds_simulated_lag_a_straggler_that_starts_mid_run():
    """Hand-worked: rank 0 3.5 times as slow from 0.8 s on. Epoch 1: two rounds of 4 and 4 fast
    steps (ends at 0.8 + 2C). Epoch 2 starts slow, but its first round was planned from the fast
    steps: 4 steps of 0.35 s while the other host waits (1.4 s + C). The moving average (newest
    weighs 0.3; the epoch's first step unmeasured) reads 0.7 * 0.1 + 0.3 * 0.35 = 0.175, then
    0.2275, then 0.26425: a share of 4 x 0.1 / 0.26425 = 1.51 steps.
    - The rule before 0.2.0 rounds it to 2 (had the first step counted, 0.28998 and 1). Round 2:
      2 slow steps (0.7 s + C) and 4 fast ones; the fast host has run 8: the epoch ends at
      2.9 + 4C with 6 + 8 steps. Two more slow steps (the newest now weighs 1 - 0.7 ** 2) put the
      average at 0.32941: epoch 3 runs two rounds of 1 and 4 steps (0.4 s + C each).
    - The trainer's plan now: 1 and 4 steps in 0.4 s (12.5 steps a second) before 2 and 4 in
      0.5285 s (11.4). Round 2: 1 slow step, 0.4 s + C, ending the epoch at 2.6 + 4C with 5 + 8
      steps; that step (weighing 1 - 0.7 ** 4) puts the average at 0.32941 too: epoch 3 as above."""
    nearest = _two_hosts(straggler=3.5, plan_rule="nearest")
    ends, samples = simulate.hybrid_epochs(nearest, epochs=3, window=(0.8, np.inf))
    np.testing.assert_allclose(ends, [0.8 + 2 * C, 2.9 + 4 * C, 3.7 + 6 * C], rtol=1e-9)
    np.testing.assert_array_equal(samples, [16 * BATCH, 14 * BATCH, 10 * BATCH])
    # A window of the slow rank's own steps from its 9th: the same epochs here.
    in_steps, _ = simulate.hybrid_epochs(nearest, epochs=3, window=(8, 10 ** 6), in_steps=True)
    np.testing.assert_allclose(in_steps, ends, rtol=1e-9)
    ends, samples = simulate.hybrid_epochs(_two_hosts(straggler=3.5), epochs=3, window=(0.8, np.inf))
    np.testing.assert_allclose(ends, [0.8 + 2 * C, 2.6 + 4 * C, 3.4 + 6 * C], rtol=1e-9)
    np.testing.assert_array_equal(samples, [16 * BATCH, 13 * BATCH, 10 * BATCH])


def test_hybrid_rounds_simulated_replay_a_tail_by_each_ranks_own_steps():
    """Hand-worked: rank 0's third step (its own step 2) takes 3 times as long, every other step
    0.1 s. Round 1: 4 steps each (no plan yet); host 0 takes 0.6 s (0.1, 0.1, 0.3, 0.1), ends at
    0.6 + C. Its moving average (the epoch's first step unmeasured, the newest weighing 0.3): 0.1,
    0.16, 0.142. The plan: lengths 0.4 (4 fast steps: 2 and 4, 15 a second) or 3 x 0.142 = 0.426
    (3 and 4, 16.4 a second): 3 and 4. Round 2: 0.4 s + C; host 1 has run the epoch's 8, so it
    ends at 1.0 + 2C with 7 + 8 steps. Host 0's average falls to 0.1 + 0.042 x 0.7 ** 4 = 0.11008
    (3 steps, each weighing 1 - 0.7 ** (4 / 3)): 3 and 4 (0.4 s, 17.5 a second) lose to 4 and 4
    (0.44033 s, 18.2): epoch 2, two rounds of 4 and 4 fast steps, ends at 1.8 + 4C."""
    delays = np.ones((24, 2))
    delays[2, 0] = 3.0
    ends, samples = simulate.hybrid_epochs(_two_hosts(), epochs=2, delays=delays)
    np.testing.assert_allclose(ends, [1.0 + 2 * C, 1.8 + 4 * C], rtol=1e-9)
    np.testing.assert_array_equal(samples, [15 * BATCH, 16 * BATCH])
    # Two ranks a host: a group's step waits for its slower rank, whichever it is.
    four = _two_hosts(ranks=4, ranks_per_host=2)
    wide = np.ones((24, 4))
    wide[2, 1] = 3.0
    inner = costs.inner_seconds(four, 0.0)
    ends, samples = simulate.hybrid_epochs(four, epochs=2, delays=wide)
    one_round = costs.cross_seconds(four, 0.0)
    assert ends[0] == pytest.approx(0.6 + 0.4 + 8 * inner + 2 * one_round, rel=1e-9)
    np.testing.assert_array_equal(samples, [15 * 2 * BATCH, 16 * 2 * BATCH])
    for bad in (delays[:, :1], delays[:0], -delays):
        with pytest.raises(ValueError, match=r"delays of shape .*: use a \(steps, 2\) array of factors > 0"):
            simulate.hybrid_epochs(_two_hosts(), epochs=1, delays=bad)


def test_the_price_users_see_simulates_hybrids_rounds_under_a_tail_and_is_the_closed_form_without():
    """simulate.predict (advise, auto, the projection): without a tail every mode is
    costs.predict's; with the trace of the hand-worked rounds above (rank 0's own step 2 three
    times as long, epochs of 8 steps) hybrid runs until a group has used the trace's 16 steps:
    7 + 8 steps by 1.0 + 2C, then 8 + 8 by 1.8 + 4C, so 31 steps' samples in 1.8 + 4C; sync and
    async are the closed form's on the same trace."""
    for plain in (job(straggler=4.0, local_steps="auto", epoch_steps=22), job(), _two_hosts()):
        assert simulate.predict(plain) == costs.predict(plain)
    delays = np.ones((16, 2))
    delays[2, 0] = 3.0
    got = simulate.predict(_two_hosts(), delays)
    assert got["hybrid"] == pytest.approx(31 * BATCH / (1.8 + 4 * C), rel=1e-9)
    closed = costs.predict(_two_hosts(), delays)
    assert (got["sync"], got["async"]) == (closed["sync"], closed["async"])
    assert closed["hybrid"] > got["hybrid"]  # the mean plan runs 8 and 8 every round
    # A drawn tail: below the mean plan's price.
    tail = job(tail_sigma=0.5, local_steps="auto")
    assert simulate.predict(tail)["hybrid"] < costs.predict(tail)["hybrid"]


def test_async_steps_simulated_go_to_the_first_free_worker_and_join_at_each_epochs_end():
    """Hand-worked: 2 workers, epochs of 4 steps of 0.1 s, each followed by the pull and push
    (2C: 1 MB each way over 8 Gbit/s); worker 0's own step 1 takes 5 times as long. Epoch 1:
    steps to workers 0, 1, 0 (both free at 0.1 + 2C; the lower first), 1; worker 0 is done at
    0.1 + 0.5 + 4C, worker 1 at 0.2 + 4C and then waits for the join. Epoch 2 from there: two
    steps each, 0.2 + 4C."""
    delays = np.ones((16, 2))
    delays[1, 0] = 5.0
    ends, samples = simulate.async_epochs(_two_hosts(), epochs=2, closures=4, delays=delays)
    np.testing.assert_allclose(ends, [0.6 + 4 * C, 0.8 + 8 * C], rtol=1e-9)
    np.testing.assert_array_equal(samples, [4 * BATCH, 4 * BATCH])
    # Without a delay, epochs of whole rounds of the workers: the closed form's rate.
    one = job(straggler=1.0)
    ends, samples = simulate.async_epochs(one, epochs=3, closures=8 * 5)
    rate = samples[1:].sum() / (ends[-1] - ends[0])
    assert rate == pytest.approx(8 * BATCH / (T + 2 * B * 8 / (GBIT * 1e9) + 2 * ALPHA), rel=1e-9)
    assert rate == pytest.approx(costs.predict(one)["async"], rel=1e-9)
    with pytest.raises(ValueError, match=r"delays of shape .*: use a \(steps, 2\) array of factors > 0"):
        simulate.async_epochs(_two_hosts(), epochs=1, closures=4, delays=delays[:, :1])
    with pytest.raises(ValueError, match="use 1 or more"):
        simulate.async_epochs(_two_hosts(), epochs=1, closures=0)


def test_hybrid_rounds_simulated_agree_with_the_closed_form_for_a_persistent_straggler():
    """Two routes of the model to one figure: the closed form (mean step times, the plan they
    give) and the round-by-round simulation over a persistent straggler, after its first epoch."""
    one = job(straggler=4.0, local_steps="auto", epoch_steps=22)
    ends, samples = simulate.hybrid_epochs(one, epochs=8)
    simulated = samples[1:].sum() / (ends[-1] - ends[0])
    assert simulated == pytest.approx(costs.predict(one)["hybrid"], rel=0.03)


def test_hybrid_rounds_simulated_refuse_what_they_do_not_model_and_share_the_planners_weight():
    from tfsyncmodes.exchange import local_steps

    assert simulate.NEWEST == local_steps.NEWEST
    for bad in (dict(local_steps="fixed"), dict(ranks=1, ranks_per_host=1), dict(epoch_steps=0)):
        with pytest.raises(ValueError, match="hybrid_epochs"):
            simulate.hybrid_epochs(_two_hosts(**bad), epochs=1)
    with pytest.raises(ValueError, match="plan_rule"):
        _two_hosts(plan_rule="floor")


def test_the_models_plan_is_the_trainers_rule():
    """costs.plan_steps against the rule written on its own (tests/reference.py) on 300 random
    groups of step times, and the rule before 0.2.0 as round(period * t_fastest / t_g)."""
    rng = np.random.default_rng(11)
    for _ in range(300):
        times = list(rng.uniform(0.01, 1.0, size=rng.integers(1, 6)))
        period = int(rng.integers(1, 17))
        assert list(costs.plan_steps(times, period)) == reference.speed_shares(times, period), (times, period)
        want = [min(period, max(1, round(period * min(times) / t))) for t in times]
        assert list(costs.plan_steps(times, period, "nearest")) == want
