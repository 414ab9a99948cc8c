"""``--sync_mode=auto``: a short probe at start, and the rule that turns it into a mode.

The probe (every rank, under horovodrun), before the model exists: a few timed training steps of
one dense layer of :data:`PROBE_BYTES` of weights (a million parameters) at
:data:`PROBE_BATCH` examples per rank (a ``--sync_slow_worker`` named for the start of the run is
honoured, as in training), and the time of an allreduce of those weights' gradients across all
ranks, from which the bandwidth follows. For a dense model the ratio of exchange to compute
hardly depends on its size (both grow with the parameter count), so the probe stands for the
model to come at that batch size. The rule, :func:`choose`:

1. one process: ``sync`` (nothing to exchange);
2. the exchange takes at least half of a probe step (allreduce time / (step + allreduce time)
   >= 0.5): ``hybrid`` (dense inside groups, averaged across them; one group per host, or
   two halves of the ranks on one host, unless groups are configured);
3. the slowest rank's step time is at least ``switch_threshold`` times the median: ``hybrid``
   with the slow ranks in one group;
4. otherwise ``sync`` with ``switch_policy=straggler`` (it moves to hybrid if a straggler
   appears later, and back).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Sequence, Tuple

from tfsyncmodes.exchange import communicators
from tfsyncmodes.switching.decision import Groups, median, slow_first_groups

PROBE_BYTES = 4 << 20
PROBE_STEPS = 5
PROBE_BATCH = 32
COMM_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class Choice:
    mode: str
    switch_policy: str
    groups: Groups
    reason: str


def choose(step_times: Sequence[float], allreduce_seconds: float, threshold: float,
           group_size: int, probe_bytes: int = PROBE_BYTES) -> Choice:
    """The mode for ranks whose probe steps took `step_times` (seconds, by rank) and whose
    allreduce of `probe_bytes` took `allreduce_seconds`."""
    if len(step_times) <= 1:
        return Choice("sync", "none", (), "auto: one process: sync (nothing to exchange)")
    step = median(step_times)
    ratio = max(step_times) / step if step > 0 else 1.0
    share = allreduce_seconds / (step + allreduce_seconds) if step + allreduce_seconds > 0 else 0.0
    rate = probe_bytes / allreduce_seconds / 1e6 if allreduce_seconds > 0 else float("inf")
    figures = (f"median step {step * 1000:.1f} ms, slowest/median {ratio:.2f} (threshold {threshold:g}), "
               f"allreduce of {probe_bytes >> 20} MiB {allreduce_seconds * 1000:.1f} ms "
               f"({rate:.0f} MB/s, {share:.0%} of a step)")
    if share >= COMM_SHARE:
        return Choice("hybrid", "none", (), f"auto: hybrid: the exchange takes >= {COMM_SHARE:.0%} "
                      f"of a step; {figures}")
    if ratio >= threshold:
        groups = slow_first_groups(step_times, group_size)
        return Choice("hybrid", "none", groups, "auto: hybrid with the slow ranks in one group "
                      f"({';'.join(','.join(map(str, g)) for g in groups)}): a straggler; {figures}")
    return Choice("sync", "straggler", (), f"auto: sync with switch_policy=straggler: no straggler "
                  f"and the exchange is cheap; {figures}")


def probe(slow_factor: float = 1.0) -> Tuple[Tuple[float, ...], float]:
    """(every rank's median probe step in seconds, this job's allreduce time in seconds); the
    same on every rank (gathered)."""
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
    mine = tf.constant([[median(steps), median(timings)]], tf.float64)
    gathered = communicators.world_allgather(mine, "tfsync_auto_probe_gather").numpy()
    return tuple(float(v) for v in gathered[:, 0]), float(max(gathered[:, 1]))
