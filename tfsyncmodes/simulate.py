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
- the straggler policy's schedule is in :mod:`tfsyncmodes.simulate_policy`.

Rank 0 is the straggler and host 0 its group (the policy puts the slow ranks in the first
group; here they are the host's). Times in seconds.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional

import numpy as np

from tfsyncmodes import costs
from tfsyncmodes.costs import Job, async_update_seconds, checked_delays, cross_seconds, inner_seconds, plan_steps

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
