"""``--sync_mode=auto``: the pick from the cost model against an α–β reference written here, and a
real run whose probe is controlled (a 4x straggler named for the start of the run).

The reference is docs/switching.md's rule worked out by hand for profiles without a tail: the
link is fitted so that the probe's allreduce takes what it took, so sync's step is the slowest
rank's step plus that time; hybrid's groups of G ranks allreduce on the same link inside the
group every step and across groups every round (each column its slice, then gathered in the group);
with speed-proportional local steps every round also allgathers over all ranks and the
fastest group runs `period` steps a round and the others round(period x t_fastest / t_g).
Hybrid is picked when its rate is at least 1.25 times sync's (the documented margin).
"""
import json
import os
import re

import numpy as np
import pytest

from tests.conftest import PYTHON, REPO, run_checked
from tfsyncmodes.switching import auto
from tfsync_testbed import localrun

TRAIN = os.path.join(REPO, "scripts", "train.py")
ALPHA = 50e-6  # the fitted link's latency, as documented
SIZE = 4 << 20  # the probe's gradient bytes
BATCH = 32  # the probe's examples per rank
MARGIN = 1.25


def ring(members, allreduce_seconds, ranks, models=1):
    """A ring allreduce over `members` of `models` gradients at once on the link over which
    `ranks` members took `allreduce_seconds` for the probe's bytes."""
    if members == 1:
        return 0.0
    per_byte_pass = (allreduce_seconds - 2 * (ranks - 1) * ALPHA) * ranks / (2 * (ranks - 1))
    return 2 * (members - 1) * ALPHA + 2 * (members - 1) / members * models * per_byte_pass


def gather(members, allreduce_seconds, ranks):
    """A ring allgather of the probe's bytes in all (a slice from each) over `members`."""
    if members == 1:
        return 0.0
    per_byte_pass = (allreduce_seconds - 2 * (ranks - 1) * ALPHA) * ranks / (2 * (ranks - 1))
    return (members - 1) * ALPHA + (members - 1) / members * per_byte_pass


def reference(times, allreduce_seconds, group_size, period=8, local_steps="auto"):
    """(sync rate, hybrid rate) in samples/s, and the mode the documented rule picks."""
    ranks = len(times)
    ordered = sorted(times)
    base, slowest = float(np.median(ordered[:-1])), ordered[-1]
    sync = ranks * BATCH / (slowest + allreduce_seconds)
    groups = ranks // group_size
    model = [slowest] + [base] * (ranks - 1)  # the slow rank first: it is in the first group
    group_steps = np.array([max(model[g * group_size:(g + 1) * group_size]) for g in range(groups)])
    group_steps += ring(group_size, allreduce_seconds, ranks)
    # Each column averages its slice, then the group gathers the slices (on the same link).
    cross = ring(groups, allreduce_seconds, ranks) + gather(group_size, allreduce_seconds, ranks)
    if local_steps == "fixed":
        hybrid = ranks * BATCH * period / (period * group_steps.max() + cross)
    else:  # + the plan's allgather over every rank
        steps = np.maximum(1, np.round(period * group_steps.min() / group_steps))
        hybrid = steps.sum() * group_size * BATCH / ((steps * group_steps).max() + cross + (ranks - 1) * ALPHA)
    return sync, hybrid, ("hybrid" if hybrid >= MARGIN * sync else "sync")


@pytest.mark.parametrize("times, allreduce_seconds, group_size, local_steps, want", [
    ([0.010, 0.011, 0.010, 0.012], 0.002, 2, "auto", "sync"),      # cheap exchange, no straggler
    ([0.010, 0.040, 0.011, 0.010], 0.002, 2, "auto", "hybrid"),    # one rank 4x slow
    ([0.010, 0.040, 0.011, 0.010], 0.002, 2, "fixed", "sync"),     # ... but every round waits for it
    ([0.020, 0.021], 0.060, 1, "auto", "hybrid"),                 # the exchange is 3x the step
    ([0.010, 0.011, 0.010, 0.012], 0.020, 2, "auto", "sync"),      # one link: groups of 2 save little
    ([0.020, 0.080], 0.002, 1, "auto", "hybrid"),                 # two ranks, one 4x slow
])
def test_auto_picks_what_the_cost_model_predicts_fastest(times, allreduce_seconds, group_size, local_steps, want):
    sync, hybrid, picked = reference(times, allreduce_seconds, group_size, local_steps=local_steps)
    assert picked == want  # the case is what its comment says
    choice = auto.choose(times, allreduce_seconds, 1.5, group_size, local_steps=local_steps)
    assert choice.mode == want
    assert choice.predicted["sync"] == pytest.approx(sync, rel=1e-9)
    assert choice.predicted["hybrid"] == pytest.approx(hybrid, rel=1e-9)
    assert choice.switch_policy == ("straggler" if want == "sync" else "none")
    if want == "hybrid" and max(times) >= 1.5 * float(np.median(sorted(times)[:-1])):
        slow = int(np.argmax(times))
        assert slow in choice.groups[0] and len(choice.groups[0]) == group_size
    lines = choice.prediction_lines()
    assert [line.split()[2] for line in lines] == ["sync", "async", "hybrid"]
    assert all("\n" not in line for line in lines + (choice.reason,))


def test_one_process_is_sync():
    one = auto.choose([0.01], 0.0, 1.5, 1)
    assert (one.mode, one.switch_policy, one.predicted) == ("sync", "none", {})


def test_the_fitted_link_gives_back_the_measured_allreduce():
    from tfsyncmodes import costs

    for members, seconds in [(2, 0.003), (4, 0.05), (8, 0.4)]:
        gbit = auto.fitted_gbit(members, SIZE, seconds)
        assert costs.allreduce_seconds(members, SIZE, gbit, ALPHA) == pytest.approx(seconds, rel=1e-12)


def test_a_lognormal_spread_of_probe_steps_is_measured():
    rng = np.random.default_rng(3)
    steps = rng.lognormal(np.log(0.02), 0.4, size=2000)
    assert auto.log_sigma(list(steps)) == pytest.approx(np.std(np.log(steps), ddof=1), rel=1e-12)
    assert auto.log_sigma([0.02] * 5) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
@pytest.mark.solo  # the probe judges step times: alone under pytest-xdist
@pytest.mark.timeout(400)
def test_auto_under_a_controlled_straggler_picks_hybrid_and_logs_each_prediction(tmp_path):
    """horovodrun -np 2, rank 1 4x slow from the start (the probe sees it): the model predicts
    hybrid faster whatever the loopback link does (a round waits for no one with speed-
    proportional local steps), so the run must train in hybrid with rank 1 in its own group."""
    metrics = tmp_path / "metrics.json"
    command = localrun.horovodrun_command(2, [PYTHON, TRAIN, "--sync_mode=auto", "--epochs=1",
                                              "--sync_slow_worker=1:4.0", f"--model_dir={tmp_path / 'run'}",
                                              f"--metrics_file={metrics}"])
    result = run_checked(command, timeout=360)
    predicted = {m.group(1): float(m.group(2).replace(",", "")) for m in re.finditer(
        r"\] auto: predicted (\w+) ([0-9,.]+) samples/s", result.stderr)}
    assert sorted(predicted) == ["async", "hybrid", "sync"], result.stderr[-3000:]
    picks = [line for line in result.stderr.splitlines() if "] auto: " in line and "] auto: predicted " not in line]
    assert len(picks) == 1 and picks[0].split("] auto: ")[1].startswith("hybrid with the slow ranks in one group (1;0)"), \
        picks
    assert predicted["hybrid"] >= MARGIN * predicted["sync"]
    ratio = float(re.search(r"slowest/others' median ([0-9.]+)", picks[0]).group(1))
    assert ratio > 2.0  # the probe saw the straggler (4x, less the noise of loaded cores)
    with open(metrics, encoding="utf-8") as handle:
        got = json.load(handle)
    assert got["mode"] == "hybrid"
    # Speed-proportional local steps: the chief's group (rank 0, fast) ran every step, rank 1's
    # group fewer; the samples trained count both groups' steps at half the global batch each.
    rounds = got["local_steps_rounds"]
    per_group = [sum(a * b for a, b in zip(got[f"local_steps_group{g}"], rounds)) for g in (0, 1)]
    assert min(per_group) < max(per_group) and abs(max(per_group) - got["steps"]) <= 8  # one round at most
    assert got["samples"] == round(sum(per_group) * got["batch_size"] / 2)
    assert max(per_group) * got["batch_size"] / 2 < got["samples"] < max(per_group) * got["batch_size"]
