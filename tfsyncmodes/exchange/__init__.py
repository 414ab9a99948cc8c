"""Gradient exchange: the parts each mode chains (see :mod:`tfsyncmodes.exchange.base`).

Every part takes its own settings as keyword arguments; :mod:`~tfsyncmodes.exchange.recipes`
builds each mode's chain from the knobs, and a user may compose one in Python instead and pass
it to ``strategy.wrap(optimizer, exchange=...)``. For hybrid mode, over the strategy's groups:

    from tfsyncmodes.exchange import (NesterovOuter, PeriodicAverage, TopK, cross_group_link,
                                      hybrid_chain)

    strategy = tfsyncmodes.make_strategy("hybrid")
    link = cross_group_link(strategy.groups, TopK(ratio=0.01))   # error feedback by default
    exchange = hybrid_chain(strategy.groups,
                            PeriodicAverage(link, period=4, outer=NesterovOuter(lr=0.7, momentum=0.9)))
    optimizer = strategy.wrap(keras.optimizers.SGD(0.1), exchange=exchange)

Sync mode's: ``Chain(HorovodAllreduce())`` or ``Chain(CompressedAllreduce(TopK(ratio=0.01)))``;
async mode's: ``version = StepVersion(); Chain(version, ClipByGlobalNorm(1.0),
StalenessScaling(version))``.
"""
from tfsyncmodes.exchange.base import Chain, Exchange, Part
from tfsyncmodes.exchange.communicators import HorovodAllreduce
from tfsyncmodes.exchange.compressed_allreduce import CompressedAllreduce
from tfsyncmodes.exchange.compressors import FP16, Compressor, NoCompression, TopK
from tfsyncmodes.exchange.elastic import ElasticAverage
from tfsyncmodes.exchange.hybrid import cross_group_link, hybrid_chain
from tfsyncmodes.exchange.link import CrossGroupLink
from tfsyncmodes.exchange.local_steps import SpeedProportionalAverage
from tfsyncmodes.exchange.memory import ErrorFeedback, Memory, NoMemory
from tfsyncmodes.exchange.outer import AverageOuter, NesterovOuter
from tfsyncmodes.exchange.policies import CrossGroupPolicy, PeriodicAverage, RoundPolicy, StaleExchange
from tfsyncmodes.exchange.remedies import DelayCompensation, StaleUpdateDrop
from tfsyncmodes.exchange.staleness import ClipByGlobalNorm, InverseTimeDecay, StalenessScaling
from tfsyncmodes.exchange.streaming import StreamingAverage
from tfsyncmodes.exchange.transports import BackgroundExchange, InStep
from tfsyncmodes.exchange.version import StepVersion

__all__ = [
    "Chain", "Exchange", "Part",
    # sync
    "HorovodAllreduce", "CompressedAllreduce",
    # how updates travel
    "Compressor", "NoCompression", "FP16", "TopK", "Memory", "NoMemory", "ErrorFeedback",
    # hybrid
    "cross_group_link", "hybrid_chain", "CrossGroupLink", "InStep", "BackgroundExchange",
    "CrossGroupPolicy", "RoundPolicy", "StaleExchange", "PeriodicAverage", "SpeedProportionalAverage",
    "StreamingAverage", "ElasticAverage", "AverageOuter", "NesterovOuter",
    # async
    "StepVersion", "ClipByGlobalNorm", "DelayCompensation", "StaleUpdateDrop", "StalenessScaling",
    "InverseTimeDecay",
]
