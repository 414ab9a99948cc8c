"""The straggler policy's schedule simulated step by step over wall time (beside
:mod:`tfsyncmodes.simulate`, whose hybrid rounds it runs after a switch):

- :class:`Decider`: the policy's hysteresis, restated below the switching package;
- :func:`policy_epochs`: sync under ``--sync_switch_policy=straggler``
  (:mod:`tfsyncmodes.switching.straggler`): sync steps judged in windows of ``interval`` steps,
  hybrid's rounds after a switch (judged every ``ceil(interval / period)`` rounds on each
  group's pace), back to sync at the end of the epoch where it decided so.

Rank 0 is the straggler and host 0 its group. Times in seconds.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np

from tfsyncmodes.costs import Job, allreduce_seconds, cross_seconds, inner_seconds
from tfsyncmodes.simulate import SKIP, Rounds, _check


class Decider:
    """The straggler policy's hysteresis (:class:`tfsyncmodes.switching.decision.StragglerDecider`,
    restated here below the switching package): a window's ratio is the slowest rank's time over
    the median; `patience` windows in a row at or above `threshold` leave sync, as many below
    ``1 + (threshold - 1) / 2`` leave hybrid."""

    def __init__(self, threshold: float, patience: int):
        self.threshold, self.low, self.patience = threshold, 1.0 + (threshold - 1.0) / 2.0, patience
        self.mode, self.streak = "sync", 0

    def observe(self, times, barrier: Optional[float] = None) -> bool:
        """One window's per-rank times (and sync's mean step over them, `barrier`, where the
        window's steps were timed one by one: :func:`tfsyncmodes.switching.decision.sync_step`);
        True when it switches the mode."""
        times = np.asarray(times, dtype=float)
        middle = float(np.median(times))
        ratio = float(times.max()) / middle if middle > 0 else 1.0
        if barrier is not None and middle > 0:
            ratio = max(ratio, barrier / middle)
        leaving = ratio >= self.threshold if self.mode == "sync" else ratio < self.low
        self.streak = self.streak + 1 if leaving else 0
        if self.streak < self.patience:
            return False
        self.streak, self.mode = 0, "hybrid" if self.mode == "sync" else "sync"
        return True


def policy_epochs(job: Job, epochs: int, window=(0.0, np.inf), in_steps: bool = False, *,
                  interval: int = 10, threshold: float = 1.5, patience: int = 2, policy_overhead_ms: float = 0.0,
                  delays: Optional[np.ndarray] = None, rule: str = "barrier") -> Tuple[np.ndarray, np.ndarray, List[tuple]]:
    """Sync under the straggler policy, simulated step by step: rank 0 ``job.straggler`` times
    slower inside `window` (as in :func:`hybrid_epochs`), every rank's step also scaled by
    `delays` (steps, ranks) where given (replayed by each rank's own step count), and every step
    paying `policy_overhead_ms` (the policy's timing and Horovod's negotiation of the process
    sets it registers).

    In sync, every ``interval`` steps (counted across epochs; the first :data:`SKIP` steps after
    the start or a switch and an epoch's last step untimed) the window goes to the
    :class:`Decider`; a switch to hybrid starts its rounds at that step, the epoch's steps so far
    done by every group. In hybrid, every ``ceil(interval / period)`` rounds; a decision to go
    back takes effect at the epoch's end. What a window weighs, by `rule`:

    - ``"barrier"`` (the trainer's since 0.2.0): each rank's step were it to set the pace (its
      compute plus what the step costs after the gradients: sync's allreduce, or in hybrid the
      group's), its mean over the window's timed steps, and sync's mean step over the ranks'
      i-th latest timed steps, the longest of each i, so that a tail on every rank counts as
      sync pays for it; in sync and in hybrid alike;
    - ``"mean"`` (before 0.2.0): the first figure alone, in hybrid on each group's moving
      average.

    Returns (each epoch's end, seconds after the first step; each epoch's samples; the switches
    as (epoch, step in it, mode))."""
    _check(job, "policy_epochs")
    if rule not in ("barrier", "mean"):
        raise ValueError(f"rule={rule!r}: use barrier or mean")
    latency, length, k = job.latency_us / 1e6, job.epoch_steps, job.ranks_per_host
    allreduce = allreduce_seconds(job.ranks, job.grad_bytes, min(job.link_gbit, job.host_gbit), latency)
    inner, cross = inner_seconds(job, latency), cross_seconds(job, latency)
    base, overhead = job.step_ms / 1e3, (job.overhead_ms + policy_overhead_ms) / 1e3

    def computes(own, at: float) -> np.ndarray:
        """Every rank's compute at its own step `own` (an int or one per rank) and time `at`."""
        own = np.broadcast_to(np.asarray(own), (job.ranks,))
        factors = np.ones(job.ranks) if delays is None else delays[own % len(delays), np.arange(job.ranks)]
        slow = window[0] <= (own[0] if in_steps else at) < window[1]
        factors[0] *= job.straggler if slow else 1.0
        return base * factors + overhead

    steps_timed: List[List[float]] = [[] for _ in range(job.ranks)]  # hybrid: each rank's timed work

    def took(group: int, own: int, at: float) -> float:
        mine = computes(own, at)[group * k:(group + 1) * k] + inner
        if rounds is not None and own >= rounds_from + SKIP:
            for r, seconds in enumerate(mine):
                steps_timed[group * k + r].append(float(seconds))
        return float(mine.max())

    def judge(per_step) -> bool:
        """The barrier rule's window: each rank's mean work, and sync's mean step over its ranks'
        i-th latest timed steps, the longest of each i (no judgement where a rank timed none)."""
        n = min(len(steps) for steps in per_step)
        if n == 0:
            return False
        latest = np.array([steps[len(steps) - n:] for steps in per_step])
        return decider.observe([np.mean(steps) for steps in per_step], float(latest.max(axis=0).mean()))

    decider, every = Decider(threshold, patience), max(1, math.ceil(interval / job.period))
    now, step, switches, ends, samples = 0.0, 0, [], [], []
    rounds: Optional[Rounds] = None
    skip, window_times, counted, since, rounds_from = SKIP, np.zeros(job.ranks), 0, 0, 0
    window_steps: List[np.ndarray] = []
    for epoch in range(epochs):
        back, batch = False, 0
        if rounds is None:  # sync, until the policy switches
            while batch < length:
                own = computes(step, now) + allreduce
                now, step, batch, since = now + float(own.max()), step + 1, batch + 1, since + 1
                if skip:
                    skip -= 1
                elif batch < length:  # an epoch's last step is not timed (its end is the next epoch's)
                    window_times, counted = window_times + own, counted + 1
                    window_steps.append(own)
                if since % interval == 0 and counted:
                    if rule == "barrier":
                        switched = judge(np.transpose(window_steps).tolist())
                    else:
                        switched = decider.observe(window_times / counted)
                    window_times, counted, window_steps = np.zeros(job.ranks), 0, []
                    if switched:
                        switches.append((epoch, batch, "hybrid"))
                        rounds, skip, rounds_from = Rounds(job, now, step), SKIP, step
                        steps_timed = [[] for _ in range(job.ranks)]
                        rounds.begin_epoch(batch)
                        break
            if rounds is None:
                ends.append(now)
                samples.append(length * job.ranks * job.batch)
                continue
        else:
            rounds.begin_epoch()
        seen = 0
        while True:
            over = rounds.run(took, cross)
            seen += 1
            if not back and seen % every == 0:
                if rule == "barrier":
                    back = judge(steps_timed)
                elif rounds.average.min() > 0:
                    back = decider.observe(np.repeat(rounds.average, k))
                steps_timed = [[] for _ in range(job.ranks)]
            if over:
                break
        now = rounds.now
        ends.append(now)
        samples.append(int(rounds.in_epoch.sum()) * k * job.batch)
        if back:  # every rank takes the most steps any rank ran
            switches.append((epoch + 1, 0, "sync"))
            step, rounds, skip, since = int(rounds.ran.max()), None, SKIP, 0
    return np.array(ends), np.array(samples), switches
