"""The straggler policy simulated step by step (tfsyncmodes.simulate_policy.policy_epochs) against runs
worked by hand from the policy's documented rule, and its restated hysteresis against the
trainer's decider (tfsyncmodes.switching.decision)."""
import numpy as np
import pytest

from tfsyncmodes import costs, simulate_policy
from tfsyncmodes.switching.decision import StragglerDecider

BATCH = 64
C = 1e6 * 8 / 8e9  # 1 MB over 8 Gbit/s: sync's allreduce of two ranks and hybrid's average alike


def two_hosts(**kw):
    """Two hosts of one rank, 100 ms steps, epochs of 8 steps, 4 steps a round, no latency."""
    base = dict(ranks=2, ranks_per_host=1, step_ms=100.0, grad_mb=1.0, link_gbit=8.0, host_gbit=100.0,
                latency_us=0.0, batch=BATCH, period=4, epoch_steps=8, local_steps="auto")
    return costs.Job(**dict(base, **kw))


def test_no_straggler_stays_in_sync_and_pays_its_own_cost_every_step():
    ends, samples, switches = simulate_policy.policy_epochs(two_hosts(), 3, interval=2, policy_overhead_ms=5.0)
    np.testing.assert_allclose(ends, 8 * (0.105 + C) * np.arange(1, 4), rtol=1e-9)
    np.testing.assert_array_equal(samples, [16 * BATCH] * 3)
    assert switches == []


def test_a_straggler_that_leaves_is_judged_switched_away_from_and_back_as_worked_by_hand():
    """The rule before 0.2.0 (`mean`: each rank's compute plus the allreduce in sync, its
    group's moving average in hybrid). Rank 0 four times as slow until 3.0 s; windows of 2
    steps, patience 2 (ratio = slowest over the median of the two: 0.401 / 0.2505 = 1.6 in sync).

    - Epoch 0: steps 1-2 untimed, windows at steps 4 and 6 at 1.6: hybrid after step 6 (2.4 +
      6C). Its first round runs the 2 steps left each (the slow one 0.8 s, no plan yet): the
      epoch ends at 3.2 + 7C with 16 samples a rank; the averages 0.4 and 0.1 plan 1 and 4.
    - Epoch 1: rank 0 fast from here. Round 1: its step is the epoch's first, unmeasured (3.6 +
      8C; ratio still 1.6). Round 2: one measured fast step (weight 1 - 0.7 ** 4): 0.17203,
      ratio 1.2648, not below 1.25; the other has run 8, the epoch ends at 4.0 + 9C, 2 + 8 steps.
      Plan 2 and 4 (15 steps a second, before 3 and 4 at 13.6).
    - Epoch 2: round 1 averages 0.13529 (ratio 1.15, streak 1), plan 3 and 4 (17.2 a second);
      round 2 0.10847 (1.04, streak 2: back to sync at the epoch's end, 4.8 + 11C, 5 + 8 steps).
    - Epoch 3: sync at 0.1 + C a step."""
    ends, samples, switches = simulate_policy.policy_epochs(two_hosts(straggler=4.0), 4, (0.0, 3.0), interval=2,
                                                     rule="mean")
    np.testing.assert_allclose(ends, [3.2 + 7 * C, 4.0 + 9 * C, 4.8 + 11 * C, 5.6 + 19 * C], rtol=1e-9)
    np.testing.assert_array_equal(samples, np.array([16, 10, 13, 16]) * BATCH)
    assert switches == [(0, 6, "hybrid"), (3, 0, "sync")]


def test_the_barrier_rule_judges_each_ranks_own_steps_and_goes_back_as_soon_as_they_are_even():
    """The rule since 0.2.0 (`barrier`: each rank's own time, and sync's step as the longest of
    the ranks' steps one by one), the same straggler. Sync as above (0.4 and 0.1 of work: 1.6).
    Hybrid's first two steps after the switch are untimed, so its first round (2 steps each)
    judges nothing. Epoch 1: rank 0 is fast; each round pairs its one step with the other's
    latest: 0.1 and 0.1, ratio 1.0, twice: back to sync at the epoch's end (4.0 + 9C, 2 + 8
    steps), an epoch before the moving averages would have said so. Then sync: 0.1 + C a step."""
    ends, samples, switches = simulate_policy.policy_epochs(two_hosts(straggler=4.0), 4, (0.0, 3.0), interval=2)
    np.testing.assert_allclose(ends, [3.2 + 7 * C, 4.0 + 9 * C, 4.8 + 17 * C, 5.6 + 25 * C], rtol=1e-9)
    np.testing.assert_array_equal(samples, np.array([16, 10, 16, 16]) * BATCH)
    assert switches == [(0, 6, "hybrid"), (2, 0, "sync")]


def test_a_tail_that_no_ranks_mean_shows_moves_the_barrier_rule_to_hybrid_and_keeps_it_there():
    """The two ranks 3.2 times as slow in turn (rank 0 at even steps, rank 1 at odd): each
    rank's mean step is 0.21 + C, so the slowest over the median is 1.0 and the old rule never
    leaves sync (8 steps of 0.32 + C an epoch); sync's step is 0.32 + C every time, 1.52 times
    the median: hybrid after step 6 (1.92 + 6C), its first round's 2 steps each 0.42 s (2.34 +
    7C), and it stays: the groups' latest steps, paired, still differ by a step's turn."""
    delays = np.ones((100, 2))
    delays[0::2, 0] = delays[1::2, 1] = 3.2
    ends, _, switches = simulate_policy.policy_epochs(two_hosts(), 3, interval=2, delays=delays, rule="mean")
    np.testing.assert_allclose(ends, 8 * (0.32 + C) * np.arange(1, 4), rtol=1e-9)
    assert switches == []
    ends, samples, switches = simulate_policy.policy_epochs(two_hosts(), 3, interval=2, delays=delays)
    assert ends[0] == pytest.approx(2.34 + 7 * C, rel=1e-9) and samples[0] == 16 * BATCH
    assert switches == [(0, 6, "hybrid")]


def test_a_persistent_straggler_stays_in_hybrid_at_the_plans_pace():
    ends, samples, switches = simulate_policy.policy_epochs(two_hosts(straggler=4.0), 3, interval=2)
    np.testing.assert_allclose(ends, [3.2 + 7 * C, 4.0 + 9 * C, 4.8 + 11 * C], rtol=1e-9)
    np.testing.assert_array_equal(samples, np.array([16, 10, 10]) * BATCH)
    assert switches == [(0, 6, "hybrid")]


def test_replayed_delays_slow_each_rank_by_its_own_step_and_a_tail_under_the_threshold_never_switches():
    """Every step of rank 1 1.3 times longer (ratio 1.3 / 1.15 = 1.13: no switch): sync steps of
    0.13 + C; rank 1 twice as long at its step 3 only: that step takes 0.2 + C."""
    delays = np.ones((100, 2))
    delays[:, 1] = 1.3
    ends, _, switches = simulate_policy.policy_epochs(two_hosts(), 2, interval=2, delays=delays)
    np.testing.assert_allclose(ends, 8 * (0.13 + C) * np.arange(1, 3), rtol=1e-9)
    assert switches == []
    delays = np.ones((16, 2))
    delays[3, 1] = 2.0
    ends, _, switches = simulate_policy.policy_epochs(two_hosts(), 2, interval=2, delays=delays)
    np.testing.assert_allclose(ends, [0.9 + 8 * C, 1.7 + 16 * C], rtol=1e-9)
    assert switches == []


def test_the_restated_hysteresis_is_the_trainers_decider():
    """simulate_policy.Decider against the trainer's StragglerDecider on 200 random runs of windows."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        threshold, patience = float(rng.uniform(1.1, 3.0)), int(rng.integers(1, 4))
        ours, theirs = simulate_policy.Decider(threshold, patience), StragglerDecider(threshold, patience)
        for _ in range(30):
            times = rng.uniform(0.05, 0.1, size=4) * np.where(rng.random(4) < 0.3, rng.uniform(1, 4, 4), 1.0)
            steps = rng.uniform(0.05, 0.2, size=(4, int(rng.integers(1, 6)))) if rng.random() < 0.5 else ()
            sync = float(np.max(steps, axis=0).mean()) if len(steps) else None
            assert ours.observe(times, sync) == theirs.observe(times, steps).switched
            assert ours.mode == theirs.mode


def test_what_the_policy_simulation_does_not_model_is_refused_by_name():
    with pytest.raises(ValueError, match="rule"):
        simulate_policy.policy_epochs(two_hosts(), 1, rule="median")
    with pytest.raises(ValueError, match="policy_epochs"):
        simulate_policy.policy_epochs(two_hosts(local_steps="fixed"), 1)
    with pytest.raises(ValueError, match="policy_epochs"):
        simulate_policy.policy_epochs(two_hosts(epoch_steps=0), 1)
