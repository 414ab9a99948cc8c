"""Every async update's staleness, tallied on the parameter server by the update itself, so that
the chief reads an epoch's staleness once instead of fetching something from every step.

``ClusterCoordinator`` copies a scheduled step's outputs to the chief as soon as the step ends,
on the thread that then hands the worker its next step, whenever the step's ``RemoteValue`` is
still held (a remote read per output tensor). A runner that held every step's outputs until the
epoch's end paid those reads between each worker's steps; Keras' own loop keeps only the
latest. :class:`StalenessTally` keeps what the steps' outputs were held for: one variable on a
parameter server, a histogram of the staleness values with their sum, which each update adds
to in one atomic scatter-add beside its writes. Between two reads its growth gives the updates,
their mean and their maximum (a staleness of :attr:`StalenessTally.buckets` - 1 or more falls in
the last bucket: the maximum then reads as that, a floor).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf


class Staleness(NamedTuple):
    """The updates tallied between two reads: how many, their mean and maximum staleness."""

    updates: int
    mean: float
    max: int


class StalenessTally:
    """Create it inside the strategy's scope (its variable goes to a parameter server)."""

    def __init__(self, buckets: int = 256, name: str = "tfsync_staleness_tally"):
        if buckets < 2:
            raise ValueError(f"StalenessTally needs 2 buckets or more, got {buckets}")
        self.buckets = buckets
        # counts[0 .. buckets-1], then the sum of every staleness tallied: one variable, so that
        # one read sees each update's count and its part of the sum together (2 KiB by default:
        # under the smallest part a parameter server's variables are split into).
        self.variable = tf.Variable(tf.zeros([buckets + 1], tf.int64), trainable=False, name=name)
        self._last = np.zeros(buckets + 1, np.int64)

    def record(self, staleness) -> tf.Operation:
        """Adds one update of `staleness` (a scalar) to the tally, atomically."""
        value = tf.maximum(tf.cast(tf.reshape(staleness, []), tf.int64), 0)
        bucket = tf.minimum(value, self.buckets - 1)
        counted = tf.stack([tf.constant(1, tf.int64), value])  # one update, and its part of the sum
        where = tf.stack([bucket, tf.constant(self.buckets, tf.int64)])
        return self.variable.scatter_add(tf.IndexedSlices(counted, where)).op

    def read(self) -> Staleness:
        """The updates tallied since the last read (or since the tally was made)."""
        now = np.asarray(tf.convert_to_tensor(self.variable), np.int64)
        grown, self._last = now - self._last, now
        counts = grown[:self.buckets]
        updates = int(counts.sum())
        if updates == 0:
            return Staleness(0, 0.0, 0)
        return Staleness(updates, float(grown[self.buckets]) / updates, int(np.flatnonzero(counts)[-1]))
