"""Sync mode's compressed exchange under Horovod: every rank compresses its own gradient
(with error feedback), every payload crosses (allgather for Top-K, whose indices differ per
rank; an allreduce in the payload's dtype for fp16), and every rank applies the same
decompressed mean, summed in rank order, so the ranks' weights stay identical bit for bit.

It is the cross-group exchange with one rank per group and no group's own update kept dense,
so it reuses the same link (memory, compressor, traffic) and communicators::

    CompressedAllreduce(TopK(ratio=0.01))      # over every Horovod rank, error feedback on
"""
from __future__ import annotations

from typing import Optional

from tfsyncmodes.exchange.communicators import CrossGroupCommunicator, across_world
from tfsyncmodes.exchange.compressors import Compressor
from tfsyncmodes.exchange.flat import flatten, unflatten
from tfsyncmodes.exchange.link import CrossGroupLink
from tfsyncmodes.exchange.memory import Memory, default_memory
from tfsyncmodes.exchange.policies import CrossGroupPolicy
from tfsyncmodes.exchange.transports import InStep

NAME = "tfsync.sync.compressed"


class CompressedAllreduce(CrossGroupPolicy):
    """The mean over all ranks of their compressed gradients.

    `compressor`: how each gradient travels; `memory`: None gives error feedback to a
    compressor that drops information; `communicator`: every rank a group of its own (None:
    the whole Horovod world, :func:`~tfsyncmodes.exchange.communicators.across_world`, which
    needs Horovod initialised).
    """

    def __init__(self, compressor: Compressor, memory: Optional[Memory] = None,
                 communicator: Optional[CrossGroupCommunicator] = None):
        self.communicator = communicator if communicator is not None else across_world(compressor)
        memory = memory if memory is not None else default_memory(compressor)
        super().__init__(CrossGroupLink(compressor, memory, InStep(self.communicator, compressor)))
        self.compressor = compressor

    def attach(self, inner_optimizer):
        check = getattr(self.link.memory, "attach", None)  # a memory may check the optimizer
        if check is not None:
            check(inner_optimizer)

    def transform(self, grads, variables):
        if not self.active:
            return grads
        payload = self.link.send(flatten(grads, variables))
        total = self.communicator.send_receive(payload, self.compressor, self.ctx, NAME, everyone=True)
        mean = total / float(self.num_groups)
        return [None if g is None else u for g, u in zip(grads, unflatten(mean, variables))]

    def finish(self, variables) -> None:
        """Every rank already holds the same model."""
