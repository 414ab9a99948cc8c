"""Sync mode with ``--sync_compression`` under Horovod: every rank compresses its own gradient
(with error feedback), every payload crosses (allgather for Top-K, whose indices differ per
rank; an allreduce in the payload's dtype for fp16), and every rank applies the same
decompressed mean, summed in rank order, so the ranks' weights stay identical bit for bit.

It is the cross-group exchange with one rank per group and no group's own update kept dense,
so it reuses the same link (memory, compressor, traffic) and communicators.
"""
from __future__ import annotations

from tfsyncmodes.exchange.flat import flatten, unflatten
from tfsyncmodes.exchange.policies import CrossGroupPolicy


class CompressedAllreduce(CrossGroupPolicy):
    """The mean over all ranks of their compressed gradients."""

    def transform(self, grads, variables):
        if not self.link.active:
            return grads
        payload = self.link.send(flatten(grads, variables))
        total = self.link.transport.communicator.send_receive(
            payload, self.link.compressor, self.ctx, "tfsync.sync.compressed", everyone=True)
        mean = total / float(self.num_groups)
        return [None if g is None else u for g, u in zip(grads, unflatten(mean, variables))]

    def finish(self, variables) -> None:
        """Every rank already holds the same model."""


def compressed_allreduce(config, rank: int, size: int) -> CompressedAllreduce:
    """Over the whole Horovod world: `rank` of `size`."""
    import horovod.tensorflow as hvd

    from tfsyncmodes.exchange import memory as memory_lib
    from tfsyncmodes.exchange.communicators import cross_group
    from tfsyncmodes.exchange.link import CrossGroupLink
    from tfsyncmodes.exchange.transports import InStep
    from tfsyncmodes.registry import COMPRESSORS

    compressor = COMPRESSORS.get(config.compression, config.sources.get("compression", "default"),
                                 "compression")(config)
    communicator = cross_group(compressor, hvd.global_process_set, list(range(size)), rank)
    link = CrossGroupLink(compressor, memory_lib.for_config(config, compressor),
                          InStep(communicator, compressor), size)
    return CompressedAllreduce(config, link)
