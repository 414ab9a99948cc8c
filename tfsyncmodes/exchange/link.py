"""The cross-group link: error feedback, compression, traffic accounting and a transport,
composed. Cross-group policies send through it and know nothing of what is inside; callbacks
read its counters through its methods."""
from __future__ import annotations

from typing import Optional, Tuple

import tensorflow as tf

from tfsyncmodes.exchange.base import StateFactory
from tfsyncmodes.exchange.compressors import Compressor
from tfsyncmodes.exchange.flat import TensorContext
from tfsyncmodes.exchange.memory import Memory
from tfsyncmodes.exchange.traffic import WireTraffic


class CrossGroupLink:
    """``send(tensor)`` compensates with the memory, compresses, remembers what was dropped,
    counts the bytes, and returns the payload; ``exchange(payload)`` hands it to the transport
    and returns the sum of the other groups' updates (dense).

    `compressor`, `memory` and `transport` (:class:`~tfsyncmodes.exchange.transports.InStep`
    or :class:`~tfsyncmodes.exchange.transports.BackgroundExchange`) are the link's parts;
    the groups it links are its transport's communicator's.
    """

    def __init__(self, compressor: Compressor, memory: Memory, transport):
        self.compressor = compressor
        self.memory = memory
        self.transport = transport
        self.traffic = WireTraffic()
        self.ctx: Optional[TensorContext] = None

    @property
    def num_groups(self) -> int:
        return self.transport.num_groups

    @property
    def own_group(self) -> int:
        """This rank's group index."""
        return self.transport.own_group

    @property
    def active(self) -> bool:
        """Whether there are other groups to exchange with."""
        return self.num_groups > 1

    @property
    def background(self) -> bool:
        """Whether rounds run on a thread and may be applied steps late."""
        return self.transport.background

    def build(self, ctx: TensorContext, state: StateFactory) -> None:
        self.ctx = ctx
        self.memory.build(ctx, state)
        self.traffic.build(ctx.size, state)
        self.transport.build(ctx, state, start=self.active)

    def payload(self, tensor: tf.Tensor, ctx: Optional[TensorContext] = None, memory: Optional[Memory] = None):
        """(the payload of `tensor`, its bytes on the wire), the bytes not counted yet: `tensor`
        compensated by `memory` (None: the link's), compressed, and what was dropped remembered
        before the payload is handed on."""
        ctx = ctx or self.ctx
        memory = self.memory if memory is None else memory
        compensated = memory.compensate(tensor, ctx)
        payload = self.compressor.compress(compensated, ctx)
        remembered = memory.update(compensated, payload, self.compressor, ctx)
        with tf.control_dependencies([remembered]):
            return tuple(tf.identity(t) for t in payload), self.transport.wire_bytes(payload)

    def send(self, tensor: tf.Tensor, ctx: Optional[TensorContext] = None):
        """The payload of `tensor`, its bytes counted. `ctx`: a fragment's context
        (:meth:`TensorContext.part`) when `tensor` is one fragment of the model (None: the
        whole model)."""
        payload, wire = self.payload(tensor, ctx)
        with tf.control_dependencies([self.traffic.record(wire)]):
            return tuple(tf.identity(t) for t in payload)

    def exchange(self, payload, ctx: Optional[TensorContext] = None) -> tf.Tensor:
        """The other groups' sum; a fragment's (`ctx`) travels in the step, in a round of its own name."""
        if ctx is None:
            return self.transport(payload)
        return self.transport.round(payload, f"tfsync.hybrid.cross.{ctx.name}", ctx)

    def sent(self, payload, ctx: Optional[TensorContext] = None) -> tf.Tensor:
        """This group's own payload, decompressed."""
        return self.compressor.decompress(payload, ctx or self.ctx)

    def idle(self):
        """A step that sends nothing (counted as 0 bytes)."""
        return self.traffic.record(tf.constant(0, tf.int64))

    # --- eagerly, between steps -------------------------------------------------------------

    def flush(self) -> None:
        """Waits until every round handed over so far has been exchanged."""
        self.transport.flush()

    def discard(self) -> None:
        """Drops rounds that came in but were not applied."""
        self.transport.discard()

    def lag(self) -> Optional[int]:
        """Rounds handed over but not applied yet (None: rounds run in the step)."""
        return self.transport.lag()

    def rounds_applied(self) -> Optional[int]:
        """Background rounds applied so far (None: rounds run in the step)."""
        return self.transport.rounds_applied()

    @property
    def dense_bytes(self) -> int:
        """Bytes a float32 exchange of the same update sends per step."""
        return self.traffic.dense_bytes

    def bytes_sent(self) -> Optional[int]:
        """Bytes this rank sent in the last step (None before the link is built)."""
        return self.traffic.last()

    def traffic_counts(self) -> Optional[Tuple[int, int]]:
        """(bytes sent, steps) so far (None before the link is built)."""
        return self.traffic.counts()
