"""The cross-group link: error feedback, compression, traffic accounting and a transport,
composed. Cross-group policies send through it and know nothing of what is inside."""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tfsyncmodes.exchange.base import StateFactory
from tfsyncmodes.exchange.compressors import Compressor, payload_bytes
from tfsyncmodes.exchange.flat import TensorContext
from tfsyncmodes.exchange.memory import Memory
from tfsyncmodes.exchange.traffic import WireTraffic


class CrossGroupLink:
    """``send(tensor)`` compensates with the memory, compresses, remembers what was dropped,
    counts the bytes, and returns the payload; ``exchange(payload)`` hands it to the transport
    and returns the sum of the other groups' updates (dense)."""

    def __init__(self, compressor: Compressor, memory: Memory, transport, num_groups: int):
        self.compressor = compressor
        self.memory = memory
        self.transport = transport
        self.num_groups = num_groups
        self.traffic = WireTraffic()
        self.ctx: Optional[TensorContext] = None

    @property
    def active(self) -> bool:
        """Whether there are other groups to exchange with."""
        return self.num_groups > 1

    def build(self, ctx: TensorContext, state: StateFactory) -> None:
        self.ctx = ctx
        self.memory.build(ctx, state)
        self.traffic.build(ctx.size, state)
        self.transport.build(ctx, state, start=self.active)

    def send(self, tensor: tf.Tensor):
        compensated = self.memory.compensate(tensor, self.ctx)
        payload = self.compressor.compress(compensated, self.ctx)
        remembered = self.memory.update(compensated, payload, self.compressor, self.ctx)
        counted = self.traffic.record(payload_bytes(payload))
        with tf.control_dependencies([remembered, counted]):
            return tuple(tf.identity(t) for t in payload)

    def exchange(self, payload) -> tf.Tensor:
        return self.transport(payload)

    def sent(self, payload) -> tf.Tensor:
        """This group's own payload, decompressed."""
        return self.compressor.decompress(payload, self.ctx)

    def idle(self):
        """A step that sends nothing (counted as 0 bytes)."""
        return self.traffic.record(tf.constant(0, tf.int64))
