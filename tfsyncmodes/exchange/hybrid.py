"""Builds hybrid mode's exchange from the config and the strategy's groups.

    hybrid = Chain(
        HorovodAllreduce(group process set),     # dense group mean, every step
        <cross-group policy>(config, link))      # --sync_cross_group, looked up in CROSS_GROUP

    link = CrossGroupLink(compressor,            # --sync_compression, looked up in COMPRESSORS
                          memory,                # error feedback (MEMORIES)
                          transport)             # in the step, or on a background thread

A policy with ``background = True`` (``stale``) and staleness > 0 runs its rounds on a background thread, applied up to
`staleness` steps late; everything else exchanges inside the step. ``periodic`` (local SGD)
averages the groups' model changes every ``period`` steps after the inner update.
At the end of training every rank moves to the mean of the groups' models.
"""
from __future__ import annotations

from tfsyncmodes.exchange import memory as memory_lib
from tfsyncmodes.exchange.base import Chain
from tfsyncmodes.exchange.communicators import HorovodAllreduce, cross_group
from tfsyncmodes.exchange.link import CrossGroupLink
from tfsyncmodes.exchange.transports import BackgroundExchange, InStep
from tfsyncmodes.registry import COMPRESSORS, CROSS_GROUP


def hybrid_exchange(config, groups=None) -> Chain:
    """The hybrid chain for `config`, over `groups` (the strategy's
    :class:`~tfsyncmodes.exchange.groups.ActiveGroups`; None: no peers, as in a process not
    launched by horovodrun: the exchange keeps its state and changes nothing)."""
    compressor = COMPRESSORS.get(config.compression, config.sources.get("compression", "default"),
                                 "compression")(config)
    memory = memory_lib.for_config(config, compressor)
    if groups is None:
        communicator, num_groups, group_set = cross_group(compressor, None, [0], 0), 1, None
    else:
        layout = groups.layout
        column = sorted(layout.column_of(groups.rank))
        order = [column.index(rank) for rank in layout.column_of(groups.rank)]
        communicator = cross_group(compressor, groups.cross_set, order, groups.group_index)
        num_groups, group_set = layout.num_groups, groups.group_set
    policy_class = CROSS_GROUP.get(config.cross_group)
    transport = InStep(communicator, compressor)
    if config.staleness > 0 and policy_class.background:
        transport = BackgroundExchange(transport, config.staleness, config.warmup_steps,
                                       group_set=group_set, discount=config.staleness_aware_lr)
    policy = policy_class(config, CrossGroupLink(compressor, memory, transport, num_groups))
    parts = [HorovodAllreduce(process_set=group_set)] if group_set is not None else []
    return Chain(*parts, policy)
