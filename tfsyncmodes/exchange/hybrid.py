"""Builds hybrid mode's exchange from typed parts over the strategy's groups.

    link = cross_group_link(groups,               # the strategy's groups (process sets)
                            TopK(ratio=0.01),     # the compressor (none: float32)
                            staleness=0)          # > 0: rounds on a background thread
    exchange = hybrid_chain(groups, PeriodicAverage(link, period=8, outer=NesterovOuter()))
             # = Chain(HorovodAllreduce(group's process set),   dense group mean, every step
             #         the cross-group policy)

The recipe (:mod:`~tfsyncmodes.exchange.recipes`) builds the same from the knobs; a user may
compose one in Python and pass it as ``strategy.wrap(optimizer, exchange=...)``. At the end of
training every rank moves to the mean of the groups' models (elastic: the center).
"""
from __future__ import annotations

from typing import Optional

from tfsyncmodes.exchange.base import Chain
from tfsyncmodes.exchange.communicators import HorovodAllreduce, across_groups
from tfsyncmodes.exchange.compressors import Compressor, NoCompression
from tfsyncmodes.exchange.link import CrossGroupLink
from tfsyncmodes.exchange.memory import Memory, default_memory
from tfsyncmodes.exchange.policies import CrossGroupPolicy
from tfsyncmodes.exchange.transports import BackgroundExchange, InStep


def cross_group_link(groups=None, compressor: Optional[Compressor] = None, memory: Optional[Memory] = None,
                     *, staleness: int = 0, warmup_steps: int = 0, discount: bool = True) -> CrossGroupLink:
    """The link between hybrid `groups` (the strategy's
    :class:`~tfsyncmodes.exchange.groups.ActiveGroups`, ``strategy.groups``; None: a single
    group, as in a process not launched by horovodrun: nothing crosses).

    `compressor`: how updates travel (None: :class:`NoCompression`); `memory`: None gives
    error feedback to a compressor that drops information
    (:func:`~tfsyncmodes.exchange.memory.default_memory`). `staleness` > 0 runs the rounds on
    a background thread, applied at most that many steps late (for
    :class:`~tfsyncmodes.exchange.policies.StaleExchange`), after `warmup_steps` steps in
    lockstep, each late round weighed 1 / (1 + steps late) with `discount`.
    """
    compressor = compressor if compressor is not None else NoCompression()
    memory = memory if memory is not None else default_memory(compressor)
    transport = InStep(across_groups(compressor, groups), compressor)
    if staleness > 0:
        transport = BackgroundExchange(transport, staleness, warmup_steps,
                                       group_set=None if groups is None else groups.group_set,
                                       discount=discount)
    return CrossGroupLink(compressor, memory, transport)


def hybrid_chain(groups, policy: CrossGroupPolicy) -> Chain:
    """The dense mean inside this rank's group (every step), then `policy` across the groups.
    `groups` as in :func:`cross_group_link` (None: no group mean)."""
    if policy.link.background and not policy.background:
        raise ValueError(f"{type(policy).__name__} exchanges in the step; give it a link with "
                         "staleness=0 (only a background policy such as StaleExchange takes rounds late)")
    group_set = None if groups is None else groups.group_set
    parts = [HorovodAllreduce(process_set=group_set)] if group_set is not None else []
    return Chain(*parts, policy)
