"""``--sync_mode=auto``: the cost model's pick from a profile of the user's own job (pure).

The run starts in sync with the policy :mod:`~tfsyncmodes.switching.auto_policy` runs. Over
its first ``2 * switch_interval`` steps every rank times its own steps as
the straggler policy does (:mod:`~tfsyncmodes.switching.straggler`): its wall time per step,
its time inside the train function, and its compute, stamped in the step when its gradients
are ready, before any collective. One allgather gives every rank every rank's figures
(:func:`profile_from_rows`), and every rank turns them into the same
:class:`~tfsyncmodes.costs.Job` (:func:`job_from_profile`):

- each rank's own time per step: its time between steps plus its compute (what it would take
  were no exchange to wait for); the median of all ranks' but the slowest is the job's step,
  the slowest over it its persistent straggler, and the median over ranks of the spread of
  their stamped steps (the standard deviation of the logs) its lognormal tail;
- the exchange: what the step costs after the gradients for the rank that waits least (the
  allreduce and the update), and the model's gradient bytes (its trainable weights); the link
  is fitted so that the model's ring allreduce over all ranks (α = :data:`LATENCY_US`) takes
  that long. When the run's hosts are the groups hybrid would run, that is the link between
  hosts, and the links inside a host are priced at the model's default (100 Gbit/s: NVLink or
  PCIe class); on one host every link is the fitted one;
- hybrid: the run's period and local steps, its groups (below), the steps of an epoch.

:func:`choose` predicts each mode's rate with :func:`tfsyncmodes.simulate.predict` and picks:

1. hybrid predicted at least :data:`HYBRID_MARGIN` times sync's rate: ``hybrid`` (the margin
   stands for the samples hybrid needs beyond sync's for the same accuracy, which the model
   does not predict), in one group per host when the run spans hosts of equal size that way;
   on one host with a straggler (slowest at least ``switch_threshold`` times the others'
   median) the slow ranks share the first group, else consecutive ranks share one;
2. otherwise ``sync``, and the straggler policy goes on deciding from there.

Async is not a candidate (under horovodrun there are no parameter servers); its prediction is
logged for comparison. A Job's batch is one sample, so each rate is in steps a second summed
over the ranks (samples a second over the per-rank batch).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Sequence, Tuple

from tfsyncmodes import costs, simulate
from tfsyncmodes.switching.decision import Groups, median, own_step_times, slow_first_groups

HYBRID_MARGIN = 1.25  # hybrid's predicted rate over sync's that pays for its extra samples
LATENCY_US = 50.0  # α of the fitted link (loopback and data-centre Ethernet are both below it)


@dataclasses.dataclass(frozen=True)
class Profile:
    """What the first steps of a run measured (seconds), the same on every rank."""

    own: Tuple[float, ...]    # each rank's time per step without the exchange
    exchange: float           # the step after the gradients, for the rank that waits least
    grad_bytes: float         # the model's trainable weights, in bytes
    tail_sigma: float = 0.0   # median over ranks of the log-spread of their stamped steps
    steps: int = 0            # the steps each rank timed (the fewest of any rank)


@dataclasses.dataclass(frozen=True)
class Choice:
    mode: str
    groups: Groups
    reason: str
    predicted: Dict[str, float] = dataclasses.field(default_factory=dict)  # rank-steps/s by mode

    def prediction_lines(self) -> Tuple[str, ...]:
        """One log line per mode: its predicted rate, and that over sync's."""
        sync = self.predicted.get("sync", 0.0)
        return tuple(f"auto: predicted {mode} {rate:,.1f} steps/s over all ranks ({rate / sync:.2f}x sync)" + (
            " (not a candidate under horovodrun)" if mode == "async" else "")
            for mode, rate in self.predicted.items() if sync > 0)


def profile_from_rows(rows: Sequence[Sequence[float]], grad_bytes: float) -> Profile:
    """The profile from every rank's row (wall time per step, time inside the train function
    per step, steps timed, stamped compute per step, log-spread of its stamped steps)."""
    cycle, in_step, timed, compute, sigma = (tuple(float(row[i]) for row in rows) for i in range(5))
    exchange = max(min(s - k for s, k in zip(in_step, compute)), 0.0)  # as own_step_times takes it
    own = tuple(t - exchange for t in own_step_times(cycle, in_step, compute))
    return Profile(own, exchange, float(grad_bytes), median(sigma), int(min(timed)))


def log_sigma(steps: Sequence[float]) -> float:
    """The lognormal shape of a rank's steps: the standard deviation of their logs."""
    logs = [math.log(t) for t in steps if t > 0]
    if len(logs) < 2:
        return 0.0
    mean = sum(logs) / len(logs)
    return math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1))


def fitted_gbit(members: int, size: float, seconds: float, latency_s: float = LATENCY_US / 1e6) -> float:
    """The link rate (Gbit/s) at which a ring allreduce of `size` bytes over `members` takes
    `seconds` (the inverse of :func:`tfsyncmodes.costs.allreduce_seconds`)."""
    wire = max(seconds - 2 * (members - 1) * latency_s, 1e-9)
    return 2 * (members - 1) / members * size * 8 / wire / 1e9


def job_from_profile(profile: Profile, group_size: int, groups_are_hosts: bool, period: int,
                     local_steps: str, epoch_steps: int = 0) -> costs.Job:
    """The cost model's job for a profile (see the module doc)."""
    ranks = len(profile.own)
    step = median(sorted(profile.own)[:-1]) if ranks > 1 else profile.own[0]
    step = max(step, 1e-6)
    gbit = fitted_gbit(ranks, profile.grad_bytes, max(profile.exchange, 1e-9))
    host = costs.Job.host_gbit if groups_are_hosts else gbit
    return costs.Job(ranks=ranks, step_ms=step * 1e3, grad_mb=max(profile.grad_bytes, 1.0) / 1e6, link_gbit=gbit,
                     host_gbit=host, ranks_per_host=group_size, latency_us=LATENCY_US, batch=1,
                     straggler=max(max(profile.own) / step, 1.0), tail_sigma=profile.tail_sigma,
                     period=period, local_steps=local_steps, epoch_steps=max(epoch_steps, 0))


def choose(profile: Profile, threshold: float, group_size: int, host_groups: Optional[Groups] = None, *,
           period: int = 8, local_steps: str = "auto", epoch_steps: int = 0) -> Choice:
    """The mode for a run that measured `profile`; `host_groups`: one group per host, when the
    run's hosts divide it into groups of `group_size` (None: one host, or not so)."""
    ranks = len(profile.own)
    if ranks <= 1:
        return Choice("sync", (), "auto: one process: sync (nothing to exchange)")
    job = job_from_profile(profile, group_size, host_groups is not None, period, local_steps, epoch_steps)
    predicted = simulate.predict(job)
    gain = predicted["hybrid"] / predicted["sync"]
    figures = (f"{profile.steps} steps profiled: median step {job.step_ms:.1f} ms without the exchange, "
               f"slowest/others' median {job.straggler:.2f} (threshold {threshold:g}), tail sigma "
               f"{profile.tail_sigma:.2f}, exchange {profile.exchange * 1000:.1f} ms for "
               f"{profile.grad_bytes / 1e6:.2f} MB (link {job.link_gbit:.3g} Gbit/s), hybrid/sync predicted "
               f"{gain:.2f} (pays from {HYBRID_MARGIN:g})")
    if gain < HYBRID_MARGIN:
        return Choice("sync", (), f"auto: sync, the straggler policy deciding from here; {figures}", predicted)
    if host_groups is not None:
        groups, where = host_groups, "one group per host"
    elif job.straggler >= threshold:
        groups, where = slow_first_groups(profile.own, group_size), "the slow ranks in one group"
    else:
        groups, where = tuple(tuple(range(i, i + group_size)) for i in range(0, ranks, group_size)), "groups"
    text = ";".join(",".join(map(str, g)) for g in groups)
    return Choice("hybrid", groups, f"auto: hybrid with {where} ({text}); {figures}", predicted)
