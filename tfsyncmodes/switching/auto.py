"""``--sync_mode=auto``: a short probe at start, and the cost model that turns it into a mode.

The probe (every rank, under horovodrun), before the model exists: a few timed training steps of
one dense layer of :data:`PROBE_BYTES` of weights (a million parameters) at
:data:`PROBE_BATCH` examples per rank (a ``--sync_slow_worker`` named for the start of the run is
honoured, as in training), and the time of an allreduce of those weights' gradients across all
ranks. For a dense model the ratio of exchange to compute hardly depends on its size (both grow
with the parameter count), so the probe stands for the model to come at that batch size.

:func:`choose` turns the profile into a :class:`tfsyncmodes.costs.Job` (:func:`job_from_probe`:
the median step of all ranks but the slowest, the slowest over it as a persistent straggler, the spread of
the probe steps as a lognormal tail, the link fitted from the allreduce time by the α–β model,
hybrid's groups of ``group_size`` ranks with the configured period and local steps) and
predicts each mode's samples per second with :func:`tfsyncmodes.costs.predict`:

1. one process: ``sync`` (nothing to exchange);
2. hybrid predicted at least :data:`HYBRID_MARGIN` times sync's rate: ``hybrid``, the slow ranks
   in one group when the slowest step is at least ``switch_threshold`` times the median of the
   others' (with two ranks: the faster one's) (hybrid needs
   more samples than sync for the same accuracy, which the margin stands for: the model
   predicts throughput only);
3. otherwise ``sync`` with ``switch_policy=straggler`` (it moves to hybrid if a straggler
   appears later, and back).

Async is not a candidate: under horovodrun there are no parameter servers (its prediction is
logged for comparison). The logs: one line per mode's prediction, one line with the pick.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Dict, Sequence, Tuple

from tfsyncmodes import costs
from tfsyncmodes.exchange import communicators
from tfsyncmodes.switching.decision import Groups, median, slow_first_groups

PROBE_BYTES = 4 << 20
PROBE_STEPS = 5
PROBE_BATCH = 32
HYBRID_MARGIN = 1.25  # hybrid's predicted rate over sync's that pays for its extra samples
LATENCY_US = 50.0  # α of the fitted link (loopback and data-centre Ethernet are both below it)


@dataclasses.dataclass(frozen=True)
class Choice:
    mode: str
    switch_policy: str
    groups: Groups
    reason: str
    predicted: Dict[str, float] = dataclasses.field(default_factory=dict)  # samples/s by mode

    def prediction_lines(self) -> Tuple[str, ...]:
        """One log line per mode: its predicted samples per second."""
        return tuple(f"auto: predicted {mode} {rate:,.0f} samples/s" + (
            " (not a candidate under horovodrun)" if mode == "async" else "")
            for mode, rate in self.predicted.items())


def fitted_gbit(members: int, size: float, seconds: float, latency_s: float = LATENCY_US / 1e6) -> float:
    """The link rate (Gbit/s) at which a ring allreduce of `size` bytes over `members` takes
    `seconds` (the inverse of :func:`tfsyncmodes.costs.allreduce_seconds`)."""
    wire = max(seconds - 2 * (members - 1) * latency_s, 1e-9)
    return 2 * (members - 1) / members * size * 8 / wire / 1e9


def job_from_probe(step_times: Sequence[float], allreduce_seconds: float, group_size: int, probe_bytes: int,
                   period: int, local_steps: str, tail_sigma: float = 0.0) -> costs.Job:
    """The cost model's job for a measured profile: ranks, median step, straggler, tail, the
    link fitted from the allreduce, hybrid groups of `group_size` (each a "host" of the model,
    every link the fitted one)."""
    ranks = len(step_times)
    step = median(sorted(step_times)[:-1])  # the others' median: the straggler is the slowest
    gbit = fitted_gbit(ranks, probe_bytes, allreduce_seconds)
    per_group = group_size if 0 < group_size < ranks and ranks % group_size == 0 else max(ranks // 2, 1)
    return costs.Job(ranks=ranks, step_ms=step * 1e3, grad_mb=probe_bytes / 1e6, link_gbit=gbit, host_gbit=gbit,
                     ranks_per_host=per_group, latency_us=LATENCY_US, batch=PROBE_BATCH,
                     straggler=max(max(step_times) / step, 1.0) if step > 0 else 1.0, tail_sigma=tail_sigma,
                     period=period, local_steps=local_steps)


def choose(step_times: Sequence[float], allreduce_seconds: float, threshold: float,
           group_size: int, probe_bytes: int = PROBE_BYTES, *, period: int = 8,
           local_steps: str = "auto", tail_sigma: float = 0.0) -> Choice:
    """The mode for ranks whose probe steps took `step_times` (seconds, by rank) and whose
    allreduce of `probe_bytes` took `allreduce_seconds` (see the module doc)."""
    if len(step_times) <= 1:
        return Choice("sync", "none", (), "auto: one process: sync (nothing to exchange)")
    job = job_from_probe(step_times, max(allreduce_seconds, 1e-9), group_size, probe_bytes, period, local_steps,
                         tail_sigma)
    step = job.step_ms / 1e3  # the others' median (with two ranks: the faster one)
    ratio = max(step_times) / step if step > 0 else 1.0
    predicted = costs.predict(job)
    gain = predicted["hybrid"] / predicted["sync"]
    figures = (f"median step {step * 1000:.1f} ms, slowest/others' median {ratio:.2f} (threshold {threshold:g}), "
               f"allreduce of {probe_bytes >> 20} MiB {allreduce_seconds * 1000:.1f} ms "
               f"(link {job.link_gbit:.2f} Gbit/s), hybrid/sync predicted {gain:.2f} (pays from {HYBRID_MARGIN:g})")
    if gain >= HYBRID_MARGIN:
        groups = slow_first_groups(step_times, group_size) if ratio >= threshold else ()
        where = (f" with the slow ranks in one group ({';'.join(','.join(map(str, g)) for g in groups)})"
                 if groups else "")
        return Choice("hybrid", "none", groups, f"auto: hybrid{where}; {figures}", predicted)
    return Choice("sync", "straggler", (), f"auto: sync with switch_policy=straggler; {figures}", predicted)


def log_sigma(steps: Sequence[float]) -> float:
    """The lognormal shape of a rank's probe steps: the standard deviation of their logs."""
    logs = [math.log(t) for t in steps if t > 0]
    if len(logs) < 2:
        return 0.0
    mean = sum(logs) / len(logs)
    return math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1))


def probe(slow_factor: float = 1.0) -> Tuple[Tuple[float, ...], float, float]:
    """(every rank's median probe step in seconds, this job's allreduce time in seconds, the
    median over ranks of :func:`log_sigma` of their steps); the same on every rank (gathered)."""
    import tensorflow as tf

    side = int((PROBE_BYTES // 4) ** 0.5)  # a dense layer of PROBE_BYTES of float32 weights
    weights = tf.random.stateless_normal((side, side), seed=(1, 2))
    inputs = tf.random.stateless_normal((PROBE_BATCH, side), seed=(3, 4))

    @tf.function
    def work(w, x):  # forward, and the two matmuls of the backward pass
        upstream = tf.matmul(x, w)
        return tf.reduce_sum(tf.matmul(x, upstream, transpose_a=True)) + tf.reduce_sum(
            tf.matmul(upstream, w, transpose_b=True))

    work(weights, inputs).numpy()  # trace
    steps = []
    for _ in range(PROBE_STEPS):
        started = time.perf_counter()
        work(weights, inputs).numpy()
        elapsed = time.perf_counter() - started
        time.sleep((slow_factor - 1.0) * elapsed)  # an emulated straggler, as in training
        steps.append(elapsed * slow_factor)
    buffer = tf.zeros((PROBE_BYTES // 4,), tf.float32)
    communicators.world_sum(buffer, "tfsync_auto_probe_warmup").numpy()
    timings = []
    for number in range(3):
        started = time.perf_counter()
        communicators.world_sum(buffer, f"tfsync_auto_probe_{number}").numpy()
        timings.append(time.perf_counter() - started)
    mine = tf.constant([[median(steps), median(timings), log_sigma(steps)]], tf.float64)
    gathered = communicators.world_allgather(mine, "tfsync_auto_probe_gather").numpy()
    return (tuple(float(v) for v in gathered[:, 0]), float(max(gathered[:, 1])),
            median([float(v) for v in gathered[:, 2]]))
