"""Bytes on the cross-group wire, counted from the payloads really sent."""
from __future__ import annotations

from typing import Optional, Tuple

import tensorflow as tf

from tfsyncmodes.exchange.base import StateFactory


class WireTraffic:
    """Bytes this rank put on the cross-group wire, as optimizer state (so a resumed run
    continues its counts).

    ``dense_bytes`` is what a float32 exchange of the same update sends every step (sync
    mode's cost), the denominator of the compression ratio.
    """

    def __init__(self):
        self.last_step = self.total = self.steps = None
        self.dense_bytes = 0

    def build(self, size: int, state: StateFactory) -> None:
        self.dense_bytes = 4 * size
        self.last_step = state("bytes_sent", [], tf.int64)
        self.total = state("bytes_sent_total", [], tf.int64)
        self.steps = state("exchange_steps", [], tf.int64)

    def record(self, sent_bytes: tf.Tensor):
        return tf.group(self.last_step.assign(sent_bytes), self.total.assign_add(sent_bytes),
                        self.steps.assign_add(1))

    def last(self) -> Optional[int]:
        """Bytes of the last step (None before build)."""
        return int(self.last_step.numpy()) if self.last_step is not None else None

    def counts(self) -> Optional[Tuple[int, int]]:
        """(bytes, steps) so far (None before build)."""
        return (int(self.total.numpy()), int(self.steps.numpy())) if self.total is not None else None
