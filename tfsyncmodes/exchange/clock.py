"""When a rank's gradients are ready, stamped inside the step before any exchange: the rank's own
compute time, which no host timing can separate from the wait for its peers.

In sync every rank waits for the slowest inside the same step (the allreduce), so a rank slowed
inside its train function (slow kernels, a slow input pipeline read in the step) makes every
rank's step equally long as the host sees it. :class:`ComputeClock` runs first in an exchange:
it writes ``tf.timestamp()`` once the step's gradients exist, beside the collectives, which
take the gradients as they come: it does not hold them back (gating every collective on the
stamp made each wait for the last gradient and cost the policy about 3 % of sync's rate with no
straggler; Horovod's collectives are asynchronous kernels and hold no thread the stamp needs).
The straggler policy reads the stamp after
the step and takes ``stamp - (the step's start on the host, time.time())`` as the rank's compute.
The stamp is this process's measurement, not optimizer state (not checkpointed or broadcast).
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tfsyncmodes.exchange.base import Part


class ComputeClock(Part):
    """Stamps the wall time (seconds since the epoch, as ``time.time()``) at which the step's
    gradients were ready; passes them on unchanged, without waiting for the stamp."""

    def __init__(self):
        self.stamp: Optional[tf.Variable] = None

    def build(self, variables, state):
        del variables, state
        if self.stamp is None:
            with tf.init_scope():
                self.stamp = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="compute_clock_stamp")

    def transform(self, grads, variables):
        del variables
        ready = [g for g in grads if g is not None]
        with tf.control_dependencies(ready):
            self.stamp.assign(tf.timestamp())  # runs: a tf.function runs every stateful op it holds
        return list(grads)

    def read(self) -> float:
        """The last stamp (0: no step stamped yet)."""
        return float(self.stamp.numpy()) if self.stamp is not None else 0.0
