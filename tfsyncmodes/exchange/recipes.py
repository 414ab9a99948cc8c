"""What each mode exchanges: the one place that maps a resolved configuration to a chain of
parts; with :mod:`~tfsyncmodes.exchange.knob_settings`, the only modules of the exchange that
read the configuration. Both the optimizer wrapper (``tfsyncmodes.keras``) and the strategies
ask here; neither repeats the dispatch.

    exchange_for(config, groups)          # the chain an optimizer wrapped under `config` runs

- ``sync``: nothing under a tf.distribute strategy (it reduces gradients itself) or a single
  process; under Horovod one grouped allreduce per step, or with ``--sync_compression`` the
  compressed exchange (:class:`~tfsyncmodes.exchange.compressed_allreduce.CompressedAllreduce`);
  with ``--sync_dgc`` and a Top-K compression, DGC's local clipping, momentum correction and
  sparsity warm-up around it (:mod:`~tfsyncmodes.exchange.dgc`).
- ``async``: the step's version record and the staleness remedies (:func:`async_exchange`).
- ``hybrid``: the dense group mean, then the cross-group policy over a cross-group link
  (:func:`~tfsyncmodes.exchange.hybrid.hybrid_chain`), over the strategy's `groups`; with
  ``--sync_compression_per_tensor`` its compressor on each tensor of the model's vector
  (:class:`~tfsyncmodes.exchange.per_tensor.PerTensor`).
- a run that switches modes (a switch plan in force): one chain per mode behind a
  :class:`~tfsyncmodes.exchange.switchable.SwitchableExchange`.

Every part takes its own typed settings; :mod:`~tfsyncmodes.exchange.knob_settings` turns knobs
into them, each knob read in one function there. A registered part gets the knob-made settings
its constructor declares (e.g. ``ratio``, ``period``). A new mode adds its recipe with
``@recipe("name")``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Sequence, Tuple

from tfsyncmodes import cluster, registry
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange import communicators
from tfsyncmodes.exchange.base import Chain
from tfsyncmodes.exchange.compressed_allreduce import CompressedAllreduce
from tfsyncmodes.exchange.compressors import NoCompression
from tfsyncmodes.exchange.dgc import MomentumCorrection
from tfsyncmodes.exchange.groups import knob_field
from tfsyncmodes.exchange.hybrid import cross_group_link, hybrid_chain
from tfsyncmodes.exchange.knob_settings import (compressor, cross_group_policy, dgc_clip, dgc_masking, dgc_momentum,
                                               dgc_on, discounts_late_updates, memory, per_tensor, period,
                                               sparsity_warmup, stale_bound)
from tfsyncmodes.exchange.per_tensor import PerTensor
from tfsyncmodes.exchange.remedies import DelayCompensation, StaleUpdateDrop
from tfsyncmodes.exchange.staleness import ClipByGlobalNorm, InverseTimeDecay, StalenessScaling
from tfsyncmodes.exchange.switchable import SwitchableExchange
from tfsyncmodes.exchange.version import StepVersion
from tfsyncmodes import config as config_lib

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
    if in_force and "hybrid" in in_force[0][2] and config.sources.get("local_steps", "default") != "default" \
            and config.local_steps == "auto" and not getattr(in_force[0][1], "decides_at_rounds", False):
        source, field = knob_field(config, "local_steps")
        raise ConfigError(source, field, f"auto cannot run in a phase of a {in_force[0][0]} run (its phases count "
                          "steps, and speed-proportional rounds make the groups' steps unequal)",
                          "use fixed (the default of a schedule's hybrid phase)")
    return in_force[0][1:] if in_force else None


def mode_config(config, mode: str, decides_at_rounds: bool = False):
    """`config` as a phase in `mode` of a run that switches modes has it: as a run in `mode`
    alone would (per-mode defaults live in the knob table, applied by
    :func:`tfsyncmodes.config.with_mode_defaults`), except that hybrid's local steps are fixed
    unless the plan `decides_at_rounds`: a schedule's phases count steps, which every rank must
    run alike (:func:`switch_plan` refuses an explicit ``local_steps=auto`` there), while the
    straggler policy decides at rounds in its hybrid phase and leaves it at an epoch's end."""
    phase = config_lib.with_mode_defaults(config, mode)
    if phase.local_steps == "auto" and not decides_at_rounds:
        phase = dataclasses.replace(phase, local_steps="fixed")
    return phase


def exchange_for(config, groups=None, *, active_mode: Optional[str] = None) -> Chain:
    """The exchange an optimizer wrapped under `config` runs. `groups`: the strategy's hybrid
    groups (:class:`~tfsyncmodes.exchange.groups.ActiveGroups`; None: none were made);
    `active_mode`: the mode a switching strategy trains in now (None: the plan's first)."""
    planned = switch_plan(config)
    if planned is not None:
        return switchable(planned[1], config, groups, active_mode,
                          decides_at_rounds=bool(getattr(planned[0], "decides_at_rounds", False)))
    return mode_exchange(config, groups)


def switchable(modes: Sequence[str], config, groups, active_mode: Optional[str] = None,
               decides_at_rounds: bool = False) -> SwitchableExchange:
    """One exchange per mode, each built as its phase has it (:func:`mode_config`)."""
    exchanges = {m: mode_exchange(mode_config(config, m, decides_at_rounds), groups) for m in modes}
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


def _check_horovod_started(mode: str) -> None:
    """A ConfigError when this process is one rank of several under ``horovodrun`` (or
    ``mpirun``) and Horovod was not started (no strategy made): its gradients would not cross,
    and every rank would train alone, without a word (as Horovod's own DistributedOptimizer
    refuses to be made before ``hvd.init()``)."""
    if communicators.under_tf_distribute() or communicators.horovod_world()[1] > 0:
        return
    job = cluster.horovod_env()
    if job is not None and job.size > 1:
        raise ConfigError("wrap", f"mode={mode}", f"this is rank {job.rank} of a {job.size}-rank horovodrun job "
                          "and no strategy has started Horovod, so each rank would train alone",
                          "call tfsyncmodes.make_strategy() first and wrap with strategy.wrap(optimizer) "
                          "or inside strategy.scope()")


@recipe("sync")
def sync_exchange(config, groups=None) -> Chain:
    del groups
    _check_horovod_started("sync")
    rank, size = communicators.horovod_world()
    if communicators.under_tf_distribute() or size <= 1:
        return Chain()
    dgc = dgc_on(config)
    warmup = sparsity_warmup(config) if dgc else None
    chosen = compressor(config, warmup)
    if isinstance(chosen, NoCompression):
        return Chain(communicators.HorovodAllreduce())
    clip = dgc_clip(config, size) if dgc else None
    remembers = MomentumCorrection(dgc_momentum(config), dgc_masking(config)) if dgc else memory(config, chosen)
    exchange = CompressedAllreduce(chosen, remembers, communicators.across_world(chosen, (rank, size)),
                                   per_tensor=per_tensor(config, "sync"))
    return Chain(*[part for part in (clip, exchange, warmup) if part is not None])


@recipe("async")
def parameter_server_exchange(config, groups=None) -> Chain:
    del groups
    return async_exchange(config)


@recipe("hybrid")
def hybrid(config, groups=None) -> Chain:
    """Without the strategy's groups (a model loaded outside a hybrid job) the exchange keeps
    its state and changes nothing; in a multi-rank job that is a mistake, said as one."""
    _check_horovod_started("hybrid")
    if groups is None and communicators.horovod_world()[1] > 1:
        raise ConfigError("wrap", "mode=hybrid", "no hybrid strategy's scope is active",
                          "call tfsyncmodes.make_strategy('hybrid') first and wrap with "
                          "strategy.wrap(optimizer) or inside strategy.scope()")
    chosen = compressor(config)
    if per_tensor(config, "hybrid"):
        chosen = PerTensor(chosen)
    policy = registry.CROSS_GROUP.get(config.cross_group, *knob_field(config, "cross_group"))
    warmup_steps = config.warmup_steps
    link = cross_group_link(groups, chosen, memory(config, chosen),
                            staleness=stale_bound(config) if policy.background else 0,
                            warmup_steps=warmup_steps, discount=discounts_late_updates(config))
    return hybrid_chain(groups, cross_group_policy(policy, config, link, warmup_steps))


def async_exchange(config, version: Optional[StepVersion] = None) -> Chain:
    """The version record, then the remedies `config` switches on, in this order:

    1. delay compensation (DC-ASGD): it estimates the gradient at the weights the update is
       applied to, so every later remedy acts on that estimate, as on a fresh gradient;
    2. clip by global norm: bounds what is applied, compensation term included;
    3. the SSP drop (``max_staleness``): an update staler than the bound becomes zero;
    4. the scalings, 1/(1+staleness) then inverse-time decay (products, so their order and
       the drop's do not change the result);

    then the inner optimizer's update (momentum acts on the gradient the chain hands it).
    `version`: the chain's version record (None: a new one).
    """
    lam, clip_norm, bound, decay = (config.delay_compensation, config.clip_norm, config.max_staleness,
                                    config.lr_decay)
    version = version if version is not None else StepVersion()
    parts = [version, DelayCompensation(lam) if lam != "off" else None,
             ClipByGlobalNorm(clip_norm) if clip_norm != "off" else None,
             StaleUpdateDrop(bound, version) if bound != "off" else None,
             StalenessScaling(version) if discounts_late_updates(config) else None,
             InverseTimeDecay(decay, version) if decay != "off" else None]
    return Chain(*[part for part in parts if part is not None])
