"""``--sync_mode=auto``: the pick from the cost model against an α–β reference written here, the
profile taken from the ranks' timings against figures worked out by hand, and a real run whose
profile sees a controlled straggler (a 4x slow rank from the start).

The reference is docs/switching.md's rule worked out by hand for profiles without a tail: the
link is fitted so that a ring allreduce of the gradient over all ranks takes the measured
exchange, so sync's step is the slowest rank's own step plus that time; hybrid's groups of G
ranks allreduce inside the group every step (on the fitted link on one host, at 100 Gbit/s
when the groups are hosts) and across groups every round (each column its slice, then
gathered in the group); with speed-proportional local steps every round also allgathers over
all ranks, and the fastest group runs `period` steps a round and the others their share in
whole steps (tests/reference.py: speed_shares). Hybrid is picked when its rate is at least 1.25 times sync's (the documented
margin). Rates are steps a second summed over the ranks (a batch of one).
"""
import json
import os
import re

import numpy as np
import pytest

from tests.reference import speed_shares
from tests.conftest import PYTHON, REPO, run_checked
from tfsyncmodes.switching import auto
from tfsync_testbed import localrun

TRAIN = os.path.join(REPO, "scripts", "train.py")
ALPHA = 50e-6  # the fitted link's latency, as documented
HOST_BITS = 100e9  # a link inside a host when the groups are hosts, as documented
SIZE = 4e6  # gradient bytes of the cases below
MARGIN = 1.25


def seconds_per_byte(exchange, ranks):
    """The fitted link: a ring allreduce of SIZE bytes over `ranks` took `exchange` seconds."""
    return (exchange - 2 * (ranks - 1) * ALPHA) / (2 * (ranks - 1) / ranks * SIZE)


def ring(members, per_byte, size=SIZE):
    return 0.0 if members == 1 else 2 * (members - 1) * ALPHA + 2 * (members - 1) / members * size * per_byte


def gather(members, per_byte, size=SIZE):
    return 0.0 if members == 1 else (members - 1) * ALPHA + (members - 1) / members * size * per_byte


def reference(own, exchange, group_size, hosts=False, period=8, local_steps="auto"):
    """(sync rate, hybrid rate) in steps/s over all ranks, and the mode the documented rule picks."""
    ranks = len(own)
    ordered = sorted(own)
    base, slowest = float(np.median(ordered[:-1])), ordered[-1]
    link = seconds_per_byte(exchange, ranks)
    inside = 8 / HOST_BITS if hosts else link
    sync = ranks / (slowest + exchange)
    groups = ranks // group_size
    model = [slowest] + [base] * (ranks - 1)  # the slow rank first: it is in the first group
    group_steps = np.array([max(model[g * group_size:(g + 1) * group_size]) for g in range(groups)])
    group_steps += ring(group_size, inside)
    cross = ring(groups, link) + gather(group_size, inside)
    if local_steps == "fixed":
        hybrid = ranks * period / (period * group_steps.max() + cross)
    else:  # + the plan's allgather over every rank
        steps = np.array(speed_shares(list(group_steps), period))
        hybrid = steps.sum() * group_size / ((steps * group_steps).max() + cross + (ranks - 1) * ALPHA)
    return sync, hybrid, ("hybrid" if hybrid >= MARGIN * sync else "sync")


@pytest.mark.parametrize("own, exchange, group_size, hosts, local_steps, want", [
    ([0.010, 0.011, 0.010, 0.012], 0.002, 2, False, "auto", "sync"),     # cheap exchange, no straggler
    ([0.010, 0.040, 0.011, 0.010], 0.002, 2, False, "auto", "hybrid"),   # one rank 4x slow
    ([0.010, 0.040, 0.011, 0.010], 0.002, 2, False, "fixed", "sync"),    # ... but every round waits for it
    ([0.020, 0.021], 0.060, 1, False, "auto", "hybrid"),                # the exchange is 3x the step
    ([0.010, 0.011, 0.010, 0.012], 0.020, 2, False, "auto", "sync"),     # one link: groups of 2 save little
    ([0.010, 0.011, 0.010, 0.012], 0.020, 2, True, "auto", "hybrid"),    # ... two hosts: the slow link rarely
    ([0.050, 0.051, 0.050, 0.052], 0.010, 2, True, "auto", "sync"),      # hosts, but compute dominates
    ([0.020, 0.080], 0.002, 1, False, "auto", "hybrid"),                # two ranks, one 4x slow
])
def test_auto_picks_what_the_cost_model_predicts_fastest(own, exchange, group_size, hosts, local_steps, want):
    sync, hybrid, picked = reference(own, exchange, group_size, hosts, local_steps=local_steps)
    assert picked == want  # the case is what its comment says
    host_groups = tuple(tuple(range(i, i + group_size)) for i in range(0, len(own), group_size)) if hosts else None
    choice = auto.choose(auto.Profile(tuple(own), exchange, SIZE), 1.5, group_size, host_groups,
                         local_steps=local_steps)
    assert choice.mode == want
    assert choice.predicted["sync"] == pytest.approx(sync, rel=1e-9)
    assert choice.predicted["hybrid"] == pytest.approx(hybrid, rel=1e-9)
    if want == "hybrid" and hosts:
        assert choice.groups == host_groups
    elif want == "hybrid" and max(own) >= 1.5 * float(np.median(sorted(own)[:-1])):
        slow = int(np.argmax(own))
        assert slow in choice.groups[0] and len(choice.groups[0]) == group_size
    lines = choice.prediction_lines()
    assert [line.split()[2] for line in lines] == ["sync", "async", "hybrid"]
    assert all("\n" not in line for line in lines + (choice.reason,))


def test_one_process_is_sync():
    one = auto.choose(auto.Profile((0.01,), 0.0, SIZE), 1.5, 1)
    assert (one.mode, one.groups, one.predicted) == ("sync", (), {})


def test_the_profile_takes_each_ranks_own_step_and_the_exchange_of_the_rank_that_waits_least():
    # Rank 1 computes 40 ms; the others 10 ms and wait for it inside the step (their in-step
    # time holds its 30 ms more); every rank spends 1 ms between steps; the exchange is 5 ms.
    rows = [[0.046, 0.045, 20, 0.010, 0.1], [0.046, 0.045, 20, 0.040, 0.3], [0.046, 0.045, 19, 0.010, 0.2]]
    profile = auto.profile_from_rows(rows, 1000.0)
    assert profile.own == pytest.approx((0.011, 0.041, 0.011), abs=1e-12)
    assert profile.exchange == pytest.approx(0.005, abs=1e-12)
    assert (profile.tail_sigma, profile.steps, profile.grad_bytes) == (0.2, 19, 1000.0)


def test_the_fitted_link_gives_back_the_measured_allreduce():
    from tfsyncmodes import costs

    for members, seconds in [(2, 0.003), (4, 0.05), (8, 0.4)]:
        gbit = auto.fitted_gbit(members, SIZE, seconds)
        assert costs.allreduce_seconds(members, SIZE, gbit, ALPHA) == pytest.approx(seconds, rel=1e-12)


def test_a_lognormal_spread_of_steps_is_measured():
    rng = np.random.default_rng(3)
    steps = rng.lognormal(np.log(0.02), 0.4, size=2000)
    assert auto.log_sigma(list(steps)) == pytest.approx(np.std(np.log(steps), ddof=1), rel=1e-12)
    assert auto.log_sigma([0.02] * 5) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
@pytest.mark.solo  # the profile judges step times: alone under pytest-xdist
@pytest.mark.timeout(400)
def test_auto_under_a_controlled_straggler_switches_to_hybrid_after_its_profile(tmp_path):
    """horovodrun -np 2, rank 1 4x slow from the start: the profile of the run's first 20 steps
    (two windows of switch_interval 10, whatever the patience) sees it, and the model predicts hybrid faster whatever the
    loopback link does (a round waits for no one with speed-proportional local steps), so the
    run switches to hybrid at step 20, rank 1 in a group of its own, and stays there."""
    metrics = tmp_path / "metrics.json"
    command = localrun.horovodrun_command(2, [PYTHON, TRAIN, "--sync_mode=auto", "--epochs=2",
                                              "--sync_slow_worker=1:4.0", f"--model_dir={tmp_path / 'run'}",
                                              f"--metrics_file={metrics}"])
    result = run_checked(command, timeout=360)
    predicted = {m.group(1): float(m.group(2).replace(",", "")) for m in re.finditer(
        r"\] auto: predicted (\w+) ([0-9,.]+) steps/s over all ranks", result.stderr)}
    assert sorted(predicted) == ["async", "hybrid", "sync"], result.stderr[-3000:]
    picks = [line for line in result.stderr.splitlines() if "] auto: " in line and "] auto: predicted " not in line]
    assert len(picks) == 1 and picks[0].split("] auto: ")[1].startswith("hybrid with the slow ranks in one group (1;0)"), \
        picks
    assert predicted["hybrid"] >= MARGIN * predicted["sync"]
    profiled = re.search(r"(\d+) steps profiled: median step ([0-9.]+) ms .*slowest/others' median ([0-9.]+)", picks[0])
    assert int(profiled.group(1)) == 18  # 20 steps, less the 2 that trace the train function
    assert float(profiled.group(3)) > 2.0  # the profile saw the straggler (4x, less the noise of loaded cores)
    switches = re.findall(r"tfsyncmodes: step (\d+): switched (\w+) -> (\w+)", result.stderr)
    assert switches == [("20", "sync", "hybrid")], switches
    with open(metrics, encoding="utf-8") as handle:
        got = json.load(handle)
    assert got["mode"] == "hybrid" and got["modes"] == [2.0, 2.0]
    # Speed-proportional local steps after the switch: group 0 is rank 1's (the groups (1;0)),
    # and it ran fewer steps than rank 0's.
    rounds = got["local_steps_rounds"]
    per_group = [sum(a * b for a, b in zip(got[f"local_steps_group{g}"], rounds)) for g in (0, 1)]
    assert 0 < per_group[0] < per_group[1], per_group


@pytest.mark.slow  # horovodrun -np 2
@pytest.mark.timeout(200)
def test_auto_whose_run_ends_before_its_profile_says_it_trained_in_sync(tmp_path):
    """One epoch of 22 steps against a profile of 2 windows of 15 steps: no pick, and one line."""
    command = localrun.horovodrun_command(2, [PYTHON, TRAIN, "--sync_mode=auto", "--epochs=1",
                                              "--sync_switch_interval=15", f"--model_dir={tmp_path / 'run'}"])
    result = run_checked(command, timeout=180)
    said = [line for line in result.stderr.splitlines() if "auto: the run ended" in line]
    assert len(said) == 1 and said[0].startswith("[0]"), said
    assert said[0].split("tfsyncmodes: ")[1].startswith("auto: the run ended after 22 steps, before its 30-step "
                                                        "profile: it trained in sync throughout"), said
    assert "] auto: predicted" not in result.stderr and "switched sync" not in result.stderr


def test_auto_outside_horovodrun_is_plain_sync_and_says_why():
    """Not under horovodrun there is no in-process switching: auto makes sync's strategy, with no
    policy, and logs one line that says so."""
    code = ("from absl import logging; logging.set_verbosity(logging.INFO); "
            "import tfsyncmodes; s = tfsyncmodes.make_strategy('auto'); "
            "print('GOT', s.mode, s.config.switch_policy, s.config.sources['mode'], type(s).__name__)")
    result = run_checked([PYTHON, "-c", code], timeout=120)
    got = [line for line in result.stdout.splitlines() if line.startswith("GOT ")]
    assert got and got[0].split()[1:4] == ["sync", "none", "auto"], result.stdout[-1000:]
    assert "SwitchingStrategy" not in got[0]
    assert "auto: sync: not under horovodrun" in result.stderr
