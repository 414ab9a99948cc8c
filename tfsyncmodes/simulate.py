"""Schedules the cost model (:mod:`tfsyncmodes.costs`) simulates step by step over wall time,
where a straggler comes and goes and a mean over steps would miss the order of events:

- :func:`hybrid_epochs`: hybrid with ``local_steps="auto"``, its rounds one by one
  (:class:`Rounds`), the trainer's plan learning each group's speed from the steps before, so
  it lags a straggler's start and end, and shortens a group's next rounds after a long step of
  a heavy tail (a replayed trace of delays);
- :func:`predict`: :func:`tfsyncmodes.costs.predict` with hybrid's rounds under a per-step
  tail simulated (what ``advise``, ``--sync_mode=auto`` and the projection price with);
- :func:`async_epochs`: async's steps as the coordinator hands them to the first free worker,
  the workers joined at every epoch's end, so a long step there idles the others;
- :func:`policy_epochs`: sync under ``--sync_switch_policy=straggler``
  (:mod:`tfsyncmodes.switching.straggler`): sync steps judged in windows of ``interval`` steps,
  hybrid's rounds after a switch (judged every ``ceil(interval / period)`` rounds on each
  group's pace), back to sync at the end of the epoch where it decided so.

Rank 0 is the straggler and host 0 its group (the policy puts the slow ranks in the first
group; here they are the host's). Times in seconds.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from tfsyncmodes import costs
from tfsyncmodes.costs import (Job, allreduce_seconds, async_update_seconds, checked_delays, cross_seconds,
                               inner_seconds, plan_steps)

NEWEST = 0.3  # hybrid's planner: the newest step's weight in a group's moving average (local_steps.NEWEST)
SKIP = 2  # steps the policy does not time after the run's start and after each switch (their tracing)

Took = Callable[[int, int, float], float]


class Rounds:
    """Hybrid's rounds with ``local_steps="auto"`` as the trainer runs them, one at a time: each
    group's moving average of its step times (the newest weighing ``1 - 0.7 ** (period /
    planned)``, an epoch's first step unmeasured) and the plan it gives for the next round,
    clipped to the steps each group has left in the epoch. Wall time in `now`."""

    def __init__(self, job: Job, now: float = 0.0, ran: int = 0):
        groups = job.hosts
        self.job, self.now = job, now
        self.average, self.plan = np.zeros(groups), np.zeros(groups, int)
        self.ran, self.in_epoch = np.full(groups, ran), np.zeros(groups, int)
        self.measured = np.zeros(groups, bool)

    def begin_epoch(self, done: int = 0) -> None:
        """A new epoch (`done`: steps every group has already run in it, as after a switch)."""
        self.in_epoch[:] = done
        self.measured[:] = False

    def run(self, took: Took, cross: float) -> bool:
        """One round: group g's next step takes ``took(g, its own step count, its clock)``
        seconds; the round ends when the last group is done, plus `cross`. True when it ended
        the epoch (a group has run ``epoch_steps``)."""
        job, length = self.job, self.job.epoch_steps
        planned = np.where(self.plan > 0, self.plan, min(job.period, length - int(self.in_epoch.min())))
        finish = np.full(len(planned), self.now)
        for g in range(len(planned)):
            keep = (1.0 - NEWEST) ** (job.period / planned[g])
            for _ in range(planned[g]):
                seconds = took(g, int(self.ran[g]), float(finish[g]))
                if self.measured[g]:
                    self.average[g] = keep * self.average[g] + (1 - keep) * seconds if self.average[g] > 0 else seconds
                finish[g] += seconds
                self.ran[g], self.in_epoch[g], self.measured[g] = self.ran[g] + 1, self.in_epoch[g] + 1, True
        self.now = float(finish.max()) + cross
        left = length - self.in_epoch
        speed = plan_steps(self.average, job.period, job.plan_rule) if self.average.min() > 0 else \
            np.full(len(planned), job.period)
        over = bool((left <= 0).any())
        self.plan = np.minimum(speed, length if over else np.maximum(left, 1))
        return over


def _check(job: Job, name: str) -> None:
    if job.local_steps != "auto" or job.hosts < 2 or job.epoch_steps < 1:
        raise ValueError(f"{name} simulates local_steps='auto' over 2 hosts or more with epoch_steps >= 1")


def hybrid_epochs(job: Job, epochs: int, window=(0.0, np.inf), in_steps: bool = False,
                  delays: Optional[np.ndarray] = None):
    """Hybrid with ``local_steps="auto"`` simulated round by round: rank 0 is ``job.straggler``
    times slower inside `window` (seconds after the first step; `in_steps`: its own steps
    [a, b)), every rank's step scaled by `delays` (steps, ranks) where given, by its own step
    count as the trainer draws them; a group's step waits for its slowest rank. Returns (each
    epoch's end, seconds after the first step; each epoch's samples)."""
    _check(job, "hybrid_epochs")
    latency, k = job.latency_us / 1e6, job.ranks_per_host
    inner, cross = inner_seconds(job, latency), cross_seconds(job, latency)
    base, overhead = job.step_ms / 1e3, job.overhead_ms / 1e3
    delays = None if delays is None else checked_delays(delays, job.ranks)

    def took(group: int, own: int, at: float) -> float:
        factors = np.ones(k) if delays is None else delays[own % len(delays), group * k:(group + 1) * k].copy()
        if group == 0 and window[0] <= (own if in_steps else at) < window[1]:
            factors[0] *= job.straggler
        return base * float(factors.max()) + overhead + inner

    rounds = Rounds(job)
    ends, samples = [], []
    for _ in range(epochs):
        rounds.begin_epoch()
        while not rounds.run(took, cross):
            pass
        ends.append(rounds.now)
        samples.append(int(rounds.in_epoch.sum()) * job.ranks_per_host * job.batch)
    return np.array(ends), np.array(samples)


def predict(job: Job, delays: Optional[np.ndarray] = None) -> Dict[str, float]:
    """:func:`tfsyncmodes.costs.predict`, but hybrid (``local_steps="auto"``, 2 hosts or more)
    under a per-step tail, drawn or `delays`, run round by round over the same compute times
    (:class:`Rounds`: a long step shortens its group's next rounds, which a plan from the mean
    step times leaves out). Without a tail the closed form is kept."""
    predicted = costs.predict(job, delays)
    tail = delays is not None or job.tail_sigma > 0 or job.pareto_alpha > 0
    if not (tail and job.local_steps == "auto" and job.hosts > 1):
        return predicted
    times = costs.compute_seconds(job, delays=delays)
    latency, k = job.latency_us / 1e6, job.ranks_per_host
    inner, cross = inner_seconds(job, latency), cross_seconds(job, latency)
    steps = len(times)
    rounds = Rounds(job if job.epoch_steps else dataclasses.replace(job, epoch_steps=steps))
    rounds.begin_epoch()
    while rounds.ran.max() < steps:
        if rounds.run(lambda g, own, at: float(times[own % steps, g * k:(g + 1) * k].max()) + inner, cross):
            rounds.begin_epoch()
    predicted["hybrid"] = float(rounds.ran.sum()) * k * job.batch / rounds.now
    return predicted


def async_epochs(job: Job, epochs: int, closures: int, delays: Optional[np.ndarray] = None):
    """Async as the coordinator schedules it: an epoch's `closures` steps queued at once, each
    worker taking the next as soon as its last is done (the first free worker, ties the lower),
    a step its compute at its own step count (rank 0 ``job.straggler`` times slower, scaled by
    `delays` (steps, workers) where given) and then its pull and push
    (:func:`~tfsyncmodes.costs.async_update_seconds`), and the epoch ending when its last step
    is done (the loop joins the workers at every epoch's end). The servers' cap is not
    simulated (:func:`~tfsyncmodes.costs.async_capacity`). Returns (each epoch's end; each
    epoch's samples)."""
    if closures < 1 or epochs < 1:
        raise ValueError(f"async_epochs of {epochs} epochs of {closures} steps: use 1 or more of each")
    delays = None if delays is None else checked_delays(delays, job.ranks)
    base = np.full(job.ranks, job.step_ms / 1e3)
    base[0] *= job.straggler
    after = job.overhead_ms / 1e3 + async_update_seconds(job)
    own, now, ends = np.zeros(job.ranks, int), 0.0, []
    for _ in range(epochs):
        free = np.full(job.ranks, now)
        for _ in range(closures):
            worker = int(np.argmin(free))
            factor = 1.0 if delays is None else float(delays[own[worker] % len(delays), worker])
            free[worker] += base[worker] * factor + after
            own[worker] += 1
        now = float(free.max())
        ends.append(now)
    return np.array(ends), np.full(epochs, closures * job.batch)


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
