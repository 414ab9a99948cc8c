"""What each mode exchanges: the one place that maps a resolved configuration to a chain of
parts. Both the optimizer wrapper (``tfsyncmodes.keras``) and the strategies ask here; neither
repeats the dispatch.

    exchange_for(config, groups)          # the chain an optimizer wrapped under `config` runs

- ``sync``: nothing under a tf.distribute strategy (it reduces gradients itself) or a single
  process; under Horovod one grouped allreduce per step, or with ``--compression`` the
  compressed exchange (:mod:`~tfsyncmodes.exchange.compressed_allreduce`).
- ``async``: the step's version record and the staleness remedies
  (:func:`~tfsyncmodes.exchange.staleness.async_exchange`).
- ``hybrid``: the dense group mean, then the cross-group policy
  (:func:`~tfsyncmodes.exchange.hybrid.hybrid_exchange`), over the strategy's `groups`.
- a run that switches modes (a switch plan in force): one chain per mode behind a
  :class:`~tfsyncmodes.exchange.switchable.SwitchableExchange`.

A new mode adds its recipe with ``@recipe("name")``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Sequence, Tuple

from tfsyncmodes import registry
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange import communicators
from tfsyncmodes.exchange.base import Chain
from tfsyncmodes.exchange.compressed_allreduce import compressed_allreduce
from tfsyncmodes.exchange.hybrid import hybrid_exchange
from tfsyncmodes.exchange.staleness import async_exchange
from tfsyncmodes.exchange.switchable import SwitchableExchange
from tfsyncmodes.knobs import KNOBS

Recipe = Callable[..., Chain]
RECIPES: Dict[str, Recipe] = {}


def recipe(mode: str) -> Callable[[Recipe], Recipe]:
    """Registers `mode`'s recipe: ``fn(config, groups) -> Chain``."""
    def add(fn: Recipe) -> Recipe:
        RECIPES[mode] = fn
        return fn
    return add


def switch_plan(config) -> Optional[Tuple[object, Tuple[str, ...]]]:
    """(plan, modes) of the switch plan in force for `config` (at most one may be); None: the
    run stays in ``config.mode`` from start to end."""
    in_force = []
    for name in registry.SWITCH_PLANS.names():
        plan = registry.SWITCH_PLANS.get(name)()
        modes = tuple(plan.modes(config))
        if modes:
            in_force.append((name, plan, modes))
    if len(in_force) > 1:
        names = [name for name, _, _ in in_force]
        raise ConfigError("configuration", "switch plans", f"{' and '.join(names)} both decide when to "
                          "switch", "use one of them")
    return in_force[0][1:] if in_force else None


def mode_config(config, mode: str):
    """`config` as a run in `mode` alone would have it: ``mode`` set, and knobs left at their
    default take that mode's default."""
    values = {"mode": mode}
    for knob in KNOBS:
        if knob.key != "mode" and config.sources.get(knob.key, "default") == "default":
            values[knob.key] = knob.default_for(mode)
    return dataclasses.replace(config, **values)


def exchange_for(config, groups=None, *, active_mode: Optional[str] = None) -> Chain:
    """The exchange an optimizer wrapped under `config` runs. `groups`: the strategy's hybrid
    groups (:class:`~tfsyncmodes.exchange.groups.ActiveGroups`; None: none were made);
    `active_mode`: the mode a switching strategy trains in now (None: the plan's first)."""
    planned = switch_plan(config)
    if planned is not None:
        return switchable(planned[1], config, groups, active_mode)
    return mode_exchange(config, groups)


def switchable(modes: Sequence[str], config, groups, active_mode: Optional[str] = None) -> SwitchableExchange:
    """One exchange per mode, each built as a run in that mode alone would build it."""
    exchanges = {m: mode_exchange(mode_config(config, m), groups) for m in modes}
    active = active_mode if active_mode in exchanges else modes[0]
    return SwitchableExchange(exchanges, active)


def mode_exchange(config, groups=None) -> Chain:
    """`config.mode`'s exchange alone (no switch plan), over `groups`."""
    build = RECIPES.get(config.mode)
    if build is None:
        raise ConfigError(config.sources.get("mode", "argument"), "mode",
                          f"{config.mode!r} has no exchange of its own (it picks a mode when the "
                          "strategy is made)", "call tfsyncmodes.make_strategy() first and wrap "
                          "with strategy.wrap(optimizer) or inside strategy.scope()")
    return build(config, groups)


@recipe("sync")
def sync_exchange(config, groups=None) -> Chain:
    del groups
    rank, size = communicators.horovod_world()
    if communicators.under_tf_distribute() or size <= 1:
        return Chain()
    if config.compression != "none":
        return Chain(compressed_allreduce(config, rank, size))
    return Chain(communicators.HorovodAllreduce())


@recipe("async")
def parameter_server_exchange(config, groups=None) -> Chain:
    del groups
    return async_exchange(config)


@recipe("hybrid")
def hybrid(config, groups=None) -> Chain:
    """Without the strategy's groups (a model loaded outside a hybrid job) the exchange keeps
    its state and changes nothing; in a multi-rank job that is a mistake, said as one."""
    if groups is None and communicators.horovod_world()[1] > 1:
        raise ConfigError("wrap", "mode=hybrid", "no hybrid strategy's scope is active",
                          "call tfsyncmodes.make_strategy('hybrid') first and wrap with "
                          "strategy.wrap(optimizer) or inside strategy.scope()")
    return hybrid_exchange(config, groups)
