"""A cost model of each mode's throughput: compute-time distributions per rank and an α–β model
of the exchange, so that a job can be sized without a cluster (``python -m tfsyncmodes.advise``).

What a step costs, for ``ranks`` ranks of which ``ranks_per_host`` share a host:

- **Compute**: rank r's step takes ``step_ms * slow_r * X + overhead_ms`` where ``slow_r`` is a
  persistent factor (``straggler``: one rank ``factor`` times slower), X a per-step delay with
  mean 1: 1 (no tail), lognormal with shape ``tail_sigma`` (a heavy tail: most steps near the
  median, a few much longer), or Pareto with shape ``pareto_alpha`` > 1 and scale
  ``(alpha - 1) / alpha`` (heavier: infinite variance at alpha <= 2), and ``overhead_ms`` a
  fixed per-step cost that neither scales (the framework's own work around the compute).
  Expectations over X are taken by Monte Carlo with a fixed seed, or over the factors one run
  drew (``delays``: a trace), to check the model against that run.
- **Collectives** (α–β, Hockney's model): a ring allreduce of B bytes over n members moves
  ``2 (n-1)/n * B`` bytes through each member's link and pays ``2 (n-1)`` latencies α. A ring
  that crosses hosts runs at the slower of the two links.
- **sync**: every step waits for the slowest rank, then allreduces the gradient over all ranks.
- **async**: each worker computes, then pushes its gradient to and pulls the variables from the
  parameter servers in turn, each at its own pace: the push ``B`` through its own link, the pull
  ``B`` at the slower of its incoming link and the servers' together (``down_gbit``,
  ``ps * ps_gbit``; both the worker's link by default); the servers'
  links carry ``B`` out (the pulls) and ``B`` in (the pushes) per update, each direction at the
  link's rate (full duplex, as the ring assumes), so the job's rate is the lesser of the
  workers' own rates and the ``ps`` links' ``ps * rate / B`` updates a second. (Before 0.2.0
  the servers' links carried ``2 B`` an update in one direction; the emulated cluster bed, with
  the ps on a host of its own, measured 83 % of the full-duplex figure and above the other.)
- **hybrid** (one group per host): inside a group a step waits for the group's slowest rank and
  allreduces on the host's link, plus ``hybrid_overhead_ms`` (the step's own bookkeeping of
  rounds); every ``period`` steps the groups average the model across hosts. The average runs
  in *columns* (rank j of every group, :mod:`tfsyncmodes.exchange.groups`), all at once, each
  on its j-th slice of the model, then an allgather of the slices inside the host: a host's
  link carries one model a round (``hybrid_slices=False``: each column the whole model, as
  before 0.2.0, so ``ranks_per_host`` models). ``local_steps="fixed"``: every group
  runs ``period`` steps a round, so a round lasts as long as the slowest group's;
  ``"auto"``: every round also allgathers each rank's figures over all ranks ((N-1) α), the
  fastest group runs ``period`` steps (fewer on average when an epoch of ``epoch_steps`` does
  not divide into rounds: every group ends an epoch at the same round) and the others their
  share of it in whole steps (:func:`plan_steps`, at least one), so slow groups do less of the work; a
  round waits for the group whose steps added up longest (Monte Carlo over the rounds).
- **hybrid, a straggler that comes and goes** (or a replayed heavy tail, which the plan
  follows round by round), and **the straggler policy**: simulated step by step over wall time
  in :mod:`tfsyncmodes.simulate`.

It predicts throughput (samples per second), not how many samples each mode needs to reach a
given accuracy (async and hybrid usually need more than sync). Sizes are in bytes, times in
seconds unless a name says otherwise.
"""
from __future__ import annotations

import dataclasses
from typing import Dict

import numpy as np

MODES = ("sync", "async", "hybrid")
SAMPLES = 4000  # Monte Carlo steps per expectation
SEED = 0


@dataclasses.dataclass(frozen=True)
class Job:
    """A data-parallel job: its compute, its model's size and its network."""

    ranks: int
    step_ms: float                  # median compute time of one step on one rank
    grad_mb: float                  # gradient (= model) size, MB (10**6 bytes)
    link_gbit: float                # link between hosts, Gbit/s
    ranks_per_host: int = 1
    host_gbit: float = 100.0        # link inside a host, Gbit/s
    latency_us: float = 50.0        # α: one message's latency, microseconds
    batch: int = 64                 # samples per rank and step
    straggler: float = 1.0          # rank 0 is this many times slower (1: none)
    tail_sigma: float = 0.0         # lognormal shape of per-step delays (0: none)
    pareto_alpha: float = 0.0       # Pareto shape of per-step delays, mean 1 (0: none; else > 1)
    overhead_ms: float = 0.0        # per-step time that no straggler or tail scales
    period: int = 8                 # hybrid: inner steps per round
    epoch_steps: int = 0            # hybrid: steps in an epoch (0: unknown, rounds of period steps)
    hybrid_overhead_ms: float = 0.0  # hybrid: per-step time of its own bookkeeping (beyond overhead_ms)
    hybrid_slices: bool = True      # hybrid: each column averages its slice (False: the whole model)
    local_steps: str = "auto"       # hybrid: fixed | auto
    plan_rule: str = "most_steps"   # hybrid auto: the trainer's plan (most_steps; nearest: before 0.2.0)
    ps: int = 1                     # async: parameter servers
    ps_gbit: float = 0.0            # async: each server's link, Gbit/s (0: link_gbit)
    down_gbit: float = 0.0          # async: a worker's incoming link, Gbit/s (0: link_gbit, symmetric)

    def __post_init__(self):
        checks = [(self.ranks >= 1, "ranks", ">= 1"), (self.step_ms > 0, "step_ms", "> 0"),
                  (self.pareto_alpha == 0 or self.pareto_alpha > 1, "pareto_alpha", "0 (none) or > 1"),
                  (self.pareto_alpha == 0 or self.tail_sigma == 0, "pareto_alpha", "0 with a tail_sigma"),
                  (self.overhead_ms >= 0, "overhead_ms", ">= 0"),
                  (self.grad_mb > 0, "grad_mb", "> 0"), (self.link_gbit > 0, "link_gbit", "> 0"),
                  (self.host_gbit > 0, "host_gbit", "> 0"), (self.latency_us >= 0, "latency_us", ">= 0"),
                  (self.ranks_per_host >= 1 and self.ranks % self.ranks_per_host == 0, "ranks_per_host",
                   "a divisor of ranks"), (self.batch >= 1, "batch", ">= 1"),
                  (self.straggler >= 1, "straggler", ">= 1"), (self.tail_sigma >= 0, "tail_sigma", ">= 0"),
                  (self.period >= 1, "period", ">= 1"), (self.epoch_steps >= 0, "epoch_steps", ">= 0"),
                  (self.hybrid_overhead_ms >= 0, "hybrid_overhead_ms", ">= 0"), (self.local_steps in ("fixed", "auto"), "local_steps",
                                                           "fixed or auto"), (self.ps >= 1, "ps", ">= 1"),
                  (self.ps_gbit >= 0, "ps_gbit", ">= 0 (0: link_gbit)"),
                  (self.down_gbit >= 0, "down_gbit", ">= 0 (0: link_gbit)"),
                  (self.plan_rule in ("most_steps", "nearest"), "plan_rule", "most_steps or nearest")]
        for ok, name, want in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: use {want}")

    @property
    def hosts(self) -> int:
        return self.ranks // self.ranks_per_host

    @property
    def grad_bytes(self) -> float:
        return self.grad_mb * 1e6


def allreduce_seconds(members: int, size: float, gbit: float, latency_s: float) -> float:
    """A ring allreduce of `size` bytes over `members` on links of `gbit` Gbit/s."""
    if members <= 1:
        return 0.0
    return 2 * (members - 1) * latency_s + 2 * (members - 1) / members * size * 8 / (gbit * 1e9)


def _allgather_seconds(members: int, size: float, gbit: float, latency_s: float) -> float:
    """A ring allgather of `size` bytes in all (1/members from each) over `members`."""
    if members <= 1:
        return 0.0
    return (members - 1) * latency_s + (members - 1) / members * size * 8 / (gbit * 1e9)


def checked_delays(delays, ranks: int) -> np.ndarray:
    """`delays` as a (steps, ranks) float array of per-step factors > 0 (ValueError otherwise)."""
    delays = np.asarray(delays, dtype=float)
    if delays.ndim != 2 or delays.shape[1] != ranks or not len(delays) or not (delays > 0).all():
        raise ValueError(f"delays of shape {delays.shape}: use a (steps, {ranks}) array of factors > 0")
    return delays


def compute_seconds(job: Job, steps: int = SAMPLES, seed: int = SEED, delays=None) -> np.ndarray:
    """(steps, ranks) compute times: the median step, rank 0's persistent factor, a per-step
    delay of mean 1 (lognormal or Pareto), plus the fixed overhead. `delays`: a (steps, ranks)
    array of the per-step factors one run drew, replayed instead of drawn afresh (a trace)."""
    rng = np.random.default_rng(seed)
    base = np.full(job.ranks, job.step_ms / 1e3)
    base[0] *= job.straggler
    overhead = job.overhead_ms / 1e3
    if delays is not None:
        return base * checked_delays(delays, job.ranks) + overhead
    if job.tail_sigma > 0:
        sigma = job.tail_sigma
        delay = rng.lognormal(-sigma * sigma / 2, sigma, size=(steps, job.ranks))  # mean 1
    elif job.pareto_alpha > 0:
        alpha = job.pareto_alpha  # inverse transform of U in [0, 1); x_m = (alpha - 1) / alpha: mean 1
        delay = (alpha - 1) / alpha * (1.0 - rng.random(size=(steps, job.ranks))) ** (-1.0 / alpha)
    else:
        return np.tile(base + overhead, (steps, 1))
    return base * delay + overhead


def _cross_host_gbit(job: Job) -> float:
    return min(job.link_gbit, job.host_gbit) if job.hosts > 1 else job.host_gbit


def predict(job: Job, delays=None) -> Dict[str, float]:
    """Samples per second of each mode (`delays`: a run's per-step factors to replay, see
    :func:`compute_seconds`)."""
    times = compute_seconds(job, delays=delays)
    latency = job.latency_us / 1e6
    size = job.grad_bytes
    sync_step = times.max(axis=1).mean() + allreduce_seconds(job.ranks, size, _cross_host_gbit(job), latency)
    sync = job.ranks * job.batch / sync_step

    worker_rates = 1.0 / (times.mean(axis=0) + async_update_seconds(job))
    async_rate = min(worker_rates.sum(), async_capacity(job)) * job.batch

    hybrid = hybrid_rate(job, times, latency)
    return {"sync": sync, "async": async_rate, "hybrid": hybrid}


def async_update_seconds(job: Job) -> float:
    """An async worker's pull and push, B each way in turn: the push leaves through its link
    (``link_gbit``), the pull comes in at the slower of its incoming link (``down_gbit``; a
    symmetric link's rate by default) and the ``ps`` servers sending their parts at once
    (``ps * ps_gbit``). A network that limits only what a host sends (the bed's shaping; a
    cloud that caps a machine's egress only) lets a worker pull at the servers' rate. A server
    slower than the workers also slows what they push into it; the cap
    (:func:`async_capacity`) counts that, a worker's own pace here does not."""
    bits = job.grad_bytes * 8
    pull_gbit = min(job.down_gbit or job.link_gbit, job.ps * (job.ps_gbit or job.link_gbit))
    return bits / (job.link_gbit * 1e9) + bits / (pull_gbit * 1e9) + 2 * job.latency_us / 1e6


def async_capacity(job: Job) -> float:
    """Updates a second the servers' links carry (``ps_gbit`` each, else ``link_gbit``): B out and
    B in per update, one direction each, split over the ``ps`` servers."""
    return job.ps * (job.ps_gbit or job.link_gbit) * 1e9 / (job.grad_bytes * 8)


def hybrid_rate(job: Job, times: np.ndarray, latency: float) -> float:
    """Hybrid's samples per second from (steps, ranks) compute times."""
    k = job.ranks_per_host
    steps = times.reshape(len(times), job.hosts, k).max(axis=2) + inner_seconds(job, latency)
    cross = cross_seconds(job, latency)
    if job.local_steps == "fixed" or job.hosts == 1:
        return job.ranks * job.batch * job.period / (_mean_round(steps, job.period) + cross)
    mean = steps.mean(axis=0)
    plan = plan_steps(mean, job.period, job.plan_rule).astype(float)
    if job.epoch_steps:  # the epoch ends for all at the round where the fastest group has run it
        plan = np.minimum(plan, job.epoch_steps / np.ceil(job.epoch_steps / plan.max()))
    round_time = float((plan * mean).max()) + _round_wait(steps, np.round(plan).astype(int)) + cross
    return float(plan.sum()) * k * job.batch / round_time


def plan_steps(times, period: int, rule: str = "most_steps") -> np.ndarray:
    """Each group's inner steps a round from its step time (all > 0), by the trainer's plan
    (:func:`tfsyncmodes.exchange.local_steps.plan_steps`): among the round lengths of the
    fastest group's `period` steps and of each group's share ``period * t_fastest / t_g``
    rounded up, the first of most steps a second, every group running the steps that fit;
    ``"nearest"``: ``round(period * t_fastest / t_g)``, the rule before 0.2.0."""
    t = np.maximum(np.asarray(times, dtype=float), 1e-12)
    if rule == "nearest":
        return np.clip(np.round(period * t.min() / t), 1, period).astype(int)
    lengths = np.concatenate([[period * t.min()], np.ceil(period * t.min() / t - 1e-9) * t])
    steps = np.clip(np.floor(lengths[:, None] / t[None, :] + 1e-6), 1, period)
    per_second = steps.sum(axis=1) / (steps * t[None, :]).max(axis=1)
    return steps[int(np.flatnonzero(per_second * (1 + 1e-9) >= per_second.max())[0])].astype(int)


def inner_seconds(job: Job, latency: float) -> float:
    """What a hybrid step adds to its group's slowest compute: the allreduce inside the host and
    hybrid's own bookkeeping."""
    return allreduce_seconds(job.ranks_per_host, job.grad_bytes, job.host_gbit, latency) + job.hybrid_overhead_ms / 1e3


def cross_seconds(job: Job, latency: float) -> float:
    """One round's average across hosts (and, with ``local_steps="auto"``, the plan's allgather)."""
    k, size = job.ranks_per_host, job.grad_bytes
    if job.hybrid_slices:  # k slices share the link, then the host gathers them
        cross = allreduce_seconds(job.hosts, size, job.link_gbit, latency) + _allgather_seconds(k, size, job.host_gbit,
                                                                                                   latency)
    else:  # k whole models share the link
        cross = allreduce_seconds(job.hosts, size * k, job.link_gbit, latency)
    if job.local_steps == "auto" and job.hosts > 1:
        cross += (job.ranks - 1) * latency  # the plan's allgather over every rank
    return cross


def _round_wait(steps: np.ndarray, plan: np.ndarray) -> float:
    """How much longer a round is, on average, than its slowest group's expected steps: each
    group adds up its own `plan[g]` consecutive step times (Monte Carlo), the round waits for
    the largest sum."""
    rounds = len(steps) // int(plan.max())
    if rounds == 0:
        return 0.0
    sums = np.stack([steps[:rounds * n, g].reshape(rounds, n).sum(axis=1) for g, n in enumerate(plan)], axis=1)
    return float(sums.max(axis=1).mean() - (plan * steps.mean(axis=0)).max())


def _mean_round(groups: np.ndarray, period: int) -> float:
    """Mean over rounds of the slowest group's `period` steps (the groups wait for each other
    only at the round)."""
    usable = (len(groups) // period) * period
    per_round = groups[:usable].reshape(-1, period, groups.shape[1]).sum(axis=1)
    return float(per_round.max(axis=1).mean())


def best(predicted: Dict[str, float]) -> str:
    """The mode of highest throughput (ties go to the first of sync, async, hybrid)."""
    return max(MODES, key=lambda m: (predicted[m], -MODES.index(m)))
