"""The straggler policy's decision, as a pure function of the ranks' step times.

After the online policies of Sync-Switch (Li et al., "Sync-Switch: Hybrid Parameter
Synchronization for Distributed Deep Learning", ICDCS 2021, arXiv 2104.08364): training starts
synchronous (better converged accuracy); when a straggler shows up the job switches to a looser
protocol so the fast workers stop waiting, and it switches back once the straggler is gone. Here
the looser protocol is hybrid (the slow ranks share one group), and hysteresis keeps a noisy
window from flapping: `patience` consecutive windows at or above `threshold` switch to hybrid,
`patience` consecutive windows below ``1 + (threshold - 1) / 2`` switch back.

The straggler test is a window's ratio, the larger of two figures over the median rank's time
per step: the slowest rank's (a straggler), and sync's step over the window, each step the
longest of the ranks' times at it (:func:`sync_step`: a heavy tail on every rank, which no
rank's mean shows, makes sync wait at nearly every step). A rank's time is its step were it to
set the pace (:func:`own_step_times`), so the ratio is what sync's step costs over a step
without waiting.

Every rank runs the same :class:`StragglerDecider` on the same gathered numbers, so every rank
reaches the same decision without another message.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

Groups = Tuple[Tuple[int, ...], ...]


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


def own_step_times(cycle: Sequence[float], in_step: Sequence[float],
                   compute: Optional[Sequence[float]] = None) -> List[float]:
    """Each rank's time per step were it to set the pace: its own work plus what every step
    costs when no rank waits.

    With `compute` (each rank's time from its step's start to its gradients, stamped in the step
    before any exchange): its time between steps (`cycle`, its wall time per step, less
    `in_step`, its time inside the train function), its compute, and the part of the train
    function after the gradients that the rank waiting least spends there (the exchange and the
    update: ``min(in_step - compute)``). Without: its wall time per step less the time it waited
    for peers, estimated as its time inside the train function beyond the least of any rank's
    (the rank that arrives last at the collective waits least); that sees a rank slowed between
    steps but not one slowed inside them, whose peers wait for it in the same step."""
    if compute is not None:
        shared = shared_step(in_step, compute)
        return [max(c - s, 0.0) + max(k, 0.0) + shared for c, s, k in zip(cycle, in_step, compute)]
    least = min(in_step)
    return [max(c - (s - least), 0.0) for c, s in zip(cycle, in_step)]


def shared_step(in_step: Sequence[float], compute: Sequence[float]) -> float:
    """What a step costs after the gradients for the rank that waits least (the exchange and
    the update), from each rank's time inside the train function and its stamped compute."""
    return max(min(s - k for s, k in zip(in_step, compute)), 0.0)


def sync_step(steps: Sequence[Sequence[float]]) -> Optional[float]:
    """Sync's mean step over a window from each rank's own steps one by one (`steps`, its latest
    last): the ranks' i-th latest steps paired (in a hybrid phase the groups ran different steps;
    their draws are what sync would have waited on), each pair the longest. None: a rank timed
    none."""
    n = min((len(own) for own in steps), default=0)
    if n == 0:
        return None
    return sum(max(own[len(own) - n + i] for own in steps) for i in range(n)) / n


def default_group_size(config, world_size: int) -> int:
    """The policy's group size: the configured one when it divides the world into 2 groups or
    more, else half the world."""
    size = 0 if config.group_size == "host" else config.group_size
    if size and world_size % size == 0 and size < world_size:
        return size
    return max(world_size // 2, 1)


def slow_first_groups(times: Sequence[float], group_size: int) -> Groups:
    """Ranks ordered slowest first (ties: lower rank first) and cut into groups of
    `group_size`: the slow ranks share the first group, the fast ones train in the others."""
    order = sorted(range(len(times)), key=lambda rank: (-times[rank], rank))
    return tuple(tuple(sorted(order[i:i + group_size])) for i in range(0, len(order), group_size))


def slow_host_first(times: Sequence[float], hosts: Groups) -> Groups:
    """The run's host groups, the one holding the slowest rank first (ties: the lower rank)."""
    slowest = max(range(len(times)), key=lambda rank: (times[rank], -rank))
    return tuple(sorted(hosts, key=lambda group: slowest not in group))


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of one window: the mode to train in from now on and the figures behind it."""

    window: int
    mode: str
    switched: bool
    ratio: float
    slowest: int
    median: float
    times: Tuple[float, ...]
    streak: int
    groups: Groups = ()
    sync_step: Optional[float] = None  # sync's mean step over the window (:func:`sync_step`)
    steps: Tuple[Tuple[float, ...], ...] = ()  # each rank's steps one by one, its latest last

    def line(self) -> str:
        """One log line with every figure that led to the decision."""
        action = (f"switch to {self.mode}" if self.switched else f"stay in {self.mode}")
        groups = f" groups={';'.join(','.join(map(str, g)) for g in self.groups)}" if self.groups else ""
        times = ",".join(f"{t * 1000:.1f}" for t in self.times)
        slowest = self.times[self.slowest] / self.median if self.median > 0 else 1.0
        sync = f", sync's step at {self.sync_step / self.median:.2f}x" if self.sync_step and self.median > 0 else ""
        return (f"switch policy: window {self.window}: {action}{groups}: ratio {self.ratio:.2f} (slowest rank "
                f"{self.slowest} at {slowest:.2f}x the median, {self.median * 1000:.1f} ms{sync}); streak "
                f"{self.streak}; step ms per rank [{times}]")


class StragglerDecider:
    """Hysteresis over windows: sync -> hybrid after `patience` windows with ratio >=
    `threshold`, hybrid -> sync after `patience` windows with ratio < the lower threshold.
    The hybrid groups: `host_groups` where set (the run's hosts, so that a group's every-step
    exchange stays inside a host), the slow one first; else the slow ranks share the first."""

    def __init__(self, threshold: float = 1.5, patience: int = 2, group_size: int = 2,
                 mode: str = "sync", host_groups: Groups = ()):
        if threshold <= 1.0 or patience < 1 or group_size < 1:
            raise ValueError("threshold > 1, patience >= 1 and group_size >= 1 are required")
        self.threshold = threshold
        self.low = 1.0 + (threshold - 1.0) / 2.0
        self.patience = patience
        self.group_size = group_size
        self.mode = mode
        self.groups: Groups = ()
        self.host_groups = tuple(tuple(g) for g in host_groups)
        self.streak = 0
        self.window = 0

    def observe(self, times: Sequence[float], steps: Sequence[Sequence[float]] = ()) -> Decision:
        """Takes one window's per-rank step times (seconds) and, where they were stamped one by
        one, each rank's own steps (its latest last), and returns the decision."""
        times = tuple(float(t) for t in times)
        steps = tuple(tuple(float(v) for v in own) for own in steps)
        sync = sync_step(steps) if steps else None
        middle = median(times)
        slowest = max(range(len(times)), key=lambda rank: (times[rank], -rank))
        ratio = times[slowest] / middle if middle > 0 else 1.0
        if sync is not None and middle > 0:
            ratio = max(ratio, sync / middle)
        leaving = ratio >= self.threshold if self.mode == "sync" else ratio < self.low
        self.streak = self.streak + 1 if leaving else 0
        switched = self.streak >= self.patience
        if switched:
            self.streak = 0
            if self.mode == "sync":
                self.mode, self.groups = "hybrid", (slow_host_first(times, self.host_groups) if self.host_groups
                                                    else slow_first_groups(times, self.group_size))
            else:
                self.mode, self.groups = "sync", ()
        self.window += 1
        return Decision(self.window, self.mode, switched, ratio, slowest, middle, times,
                        self.streak, self.groups, sync, steps)
