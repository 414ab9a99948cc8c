"""Sync mode's compressed exchange under Horovod: every rank compresses its own gradient
(with error feedback), every payload crosses (allgather for Top-K, whose indices differ per
rank; an allreduce in the payload's dtype for fp16), and every rank applies the same
decompressed mean, summed in rank order, so the ranks' weights stay identical bit for bit.

It is the cross-group exchange with one rank per group and no group's own update kept dense,
so it reuses the same link (memory, compressor, traffic) and communicators::

    CompressedAllreduce(TopK(ratio=0.01))      # over every Horovod rank, error feedback on
    CompressedAllreduce(Int8(), per_tensor=True)

By default the model travels as one flat vector: one payload, one scale (or one Top-K selection)
over every entry, one collective. ``per_tensor`` compresses each gradient on its own as it
comes, as Horovod's compression does (Horovod's keeps no residual): a payload, a scale (or
selection) and a residual per tensor, and a collective per tensor (Horovod fuses them).
Nothing is flattened, so a layer's gradient is compressed while the backward pass still
computes the layers before it, and each layer's update waits for its own tensor only.
"""
from __future__ import annotations

import copy
from typing import List, Optional

import tensorflow as tf

from tfsyncmodes.exchange.base import densify
from tfsyncmodes.exchange.communicators import CrossGroupCommunicator, across_world
from tfsyncmodes.exchange.compressors import Compressor
from tfsyncmodes.exchange.flat import TensorContext, flatten, num_elements, unflatten
from tfsyncmodes.exchange.link import CrossGroupLink
from tfsyncmodes.exchange.memory import Memory, NoMemory, default_memory
from tfsyncmodes.exchange.policies import CrossGroupPolicy
from tfsyncmodes.exchange.transports import InStep

NAME = "tfsync.sync.compressed"


class CompressedAllreduce(CrossGroupPolicy):
    """The mean over all ranks of their compressed gradients.

    `compressor`: how each gradient travels; `memory`: None gives error feedback to a
    compressor that drops information; `communicator`: every rank a group of its own (None:
    the whole Horovod world, :func:`~tfsyncmodes.exchange.communicators.across_world`, which
    needs Horovod initialised); `per_tensor`: each gradient compressed on its own, with a copy
    of `memory` of its own (see the module doc).
    """

    def __init__(self, compressor: Compressor, memory: Optional[Memory] = None,
                 communicator: Optional[CrossGroupCommunicator] = None, per_tensor: bool = False):
        self.communicator = communicator if communicator is not None else across_world(compressor)
        memory = memory if memory is not None else default_memory(compressor)
        self.per_tensor = per_tensor
        self.memory = memory  # per tensor: the model of each tensor's own memory
        self.memories: List[Memory] = []
        self.tensors: List[TensorContext] = []  # per tensor: each one's context
        link_memory = NoMemory() if per_tensor else memory  # per tensor, the tensors' memories keep it
        super().__init__(CrossGroupLink(compressor, link_memory, InStep(self.communicator, compressor)))
        self.compressor = compressor

    def build(self, variables, state):
        super().build(variables, state)
        if not self.per_tensor:
            return
        self.tensors = [TensorContext(f"tensor_{i}", (num_elements(v),)) for i, v in enumerate(variables)]
        self.memories = [copy.deepcopy(self.memory) for _ in variables]
        for i, (part, memory) in enumerate(zip(self.tensors, self.memories)):
            memory.build(part, lambda name, shape, dtype, i=i: state(f"{name}_{i}", shape, dtype))

    def attach(self, inner_optimizer):
        check = getattr(self.memory, "attach", None)  # a memory may check the optimizer
        if check is not None:
            check(inner_optimizer)

    def transform(self, grads, variables):
        if not self.active:
            return grads
        if self.per_tensor:
            return self._per_tensor(grads, variables)
        payload = self.link.send(flatten(grads, variables))
        total = self.communicator.send_receive(payload, self.compressor, self.ctx, NAME, everyone=True)
        mean = total / float(self.num_groups)
        return [None if g is None else u for g, u in zip(grads, unflatten(mean, variables))]

    def _per_tensor(self, grads, variables):
        """Each gradient compensated, compressed, sent and decompressed on its own; the step's
        bytes are the tensors' payloads together (recorded beside the updates, which wait for
        their own tensor only: a tf.function runs every stateful op it holds)."""
        sizes = [num_elements(v) for v in variables]
        if sizes != [part.size for part in self.tensors]:
            raise ValueError(f"compression per tensor was built for variables of {[p.size for p in self.tensors]} "
                             f"entries and is given {sizes}: apply gradients for the variables the optimizer was "
                             "built with, all of them, in their order")
        sent, means = [], []
        for i, (grad, variable, part, memory) in enumerate(zip(grads, variables, self.tensors, self.memories)):
            if part.size == 0:  # nothing to send (Top-K would still pick one entry)
                means.append(grad)
                continue
            vector = (tf.zeros([part.size], tf.float32) if grad is None
                      else tf.reshape(tf.cast(densify(grad), tf.float32), [part.size]))
            payload, wire = self.link.payload(vector, part, memory)
            sent.append(wire)
            total = self.communicator.send_receive(payload, self.compressor, part, f"{NAME}.{i}", everyone=True)
            mean = total / float(self.num_groups)
            means.append(None if grad is None else tf.cast(tf.reshape(mean, tuple(variable.shape)), variable.dtype))
        self.link.traffic.record(tf.add_n(sent) if sent else tf.constant(0, tf.int64))
        return means

    def finish(self, variables) -> None:
        """Every rank already holds the same model."""
