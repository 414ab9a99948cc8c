"""Knobs to a part's settings: each knob that becomes a part or a part's setting is read in one
function here (a compressor, a memory, an outer optimizer, a cross-group policy, or a setting
such as the period); :mod:`~tfsyncmodes.exchange.recipes` reads the knobs that choose a chain's
parts and builds its chains from what these return.

A registered part gets the knob-made settings its constructor declares (:func:`_settings`).
"""
from __future__ import annotations

import inspect
from typing import Optional

from tfsyncmodes import registry
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange import communicators
from tfsyncmodes.exchange.base import Part
from tfsyncmodes.exchange.compressors import Compressor
from tfsyncmodes.exchange.dgc import local_clip
from tfsyncmodes.exchange.elastic import PAPER_BETA, alpha_for
from tfsyncmodes.exchange.groups import knob_field
from tfsyncmodes.exchange.local_steps import SpeedProportionalAverage
from tfsyncmodes.exchange.memory import Memory, NoMemory, default_memory
from tfsyncmodes.exchange.outer import momentum_for_period
from tfsyncmodes.exchange.policies import CrossGroupPolicy, PeriodicAverage
from tfsyncmodes.exchange.streaming import StreamingAverage
from tfsyncmodes.exchange.warmup import SparsityWarmup
from tfsyncmodes.knobs import TOPK, per_tensor_applies


def _settings(cls, **settings) -> dict:
    """The `settings` that `cls`'s constructor declares (a part gets the knobs it has a setting for)."""
    declared = inspect.signature(cls).parameters
    return {name: value for name, value in settings.items() if name in declared}


def compressor(config, warmup: Optional[SparsityWarmup] = None, implementation: str = "auto") -> Compressor:
    """``--sync_compression``, with ``--sync_topk_ratio`` as a compressor's ``ratio``, ``--sync_quantize_sigma``
    as its ``clip_sigma``, `warmup`, `implementation` (kernels or TensorFlow ops) as its own and, with
    ``--sync_topk_shared_indices`` in sync, the union of the ranks' indices as its ``agree``."""
    cls = registry.COMPRESSORS.get(config.compression, config.sources.get("compression", "default"),
                                   "compression")
    settings = dict(ratio=config.topk_ratio, clip_sigma=config.quantize_sigma, implementation=implementation)
    if warmup is not None:
        settings["warmup"] = warmup
    if config.mode == "sync" and config.compression == "topk" and config.topk_shared_indices:
        settings["agree"] = communicators.world_union
    return cls(**_settings(cls, **settings))


def dgc_on(config) -> bool:
    """``--sync_dgc`` with a Top-K compression (sync mode's recipe reads it)."""
    return bool(config.dgc) and config.compression in TOPK


def dgc_momentum(config) -> float:  # --sync_dgc_momentum: the momentum correction's m
    return config.dgc_momentum


def dgc_masking(config) -> bool:  # --sync_dgc_masking: momentum factor masking
    return bool(config.dgc_masking)


def dgc_clip(config, ranks: int) -> Optional[Part]:
    """``--sync_dgc_clip_norm``: each of `ranks` clips to it / sqrt(ranks) (None: off)."""
    return None if config.dgc_clip_norm == "off" else local_clip(config.dgc_clip_norm, ranks)


def sparsity_warmup(config) -> Optional[SparsityWarmup]:
    """``--sync_dgc_warmup_steps`` (None: 0, no warm-up)."""
    return SparsityWarmup(config.dgc_warmup_steps) if config.dgc_warmup_steps else None


def per_tensor(config, mode: str) -> bool:
    """``--sync_compression_per_tensor`` in `mode`'s exchange, where the knob's rule lets it act:
    sync compresses each gradient on its own (not with DGC's corrections or shared Top-K
    indices); hybrid each tensor of its flat vector (a Top-K or quantizing compression)."""
    knobs = {key: getattr(config, key) for key in ("compression", "dgc", "topk_shared_indices")}
    return bool(config.compression_per_tensor) and per_tensor_applies(knobs, mode)


def memory(config, chosen: Compressor) -> Memory:
    """``--sync_error_feedback``: error feedback for a compressor that drops information."""
    return default_memory(chosen) if config.error_feedback else NoMemory()


def discounts_late_updates(config) -> bool:
    """``--sync_staleness_aware_lr``: late updates count 1 / (1 + steps late) (async and hybrid's
    stale exchange)."""
    return config.staleness_aware_lr


def stale_bound(config) -> int:  # --sync_staleness: a background policy's rounds at most this late
    return config.staleness


def period(config) -> int:  # --sync_period: updates per round (local_steps=auto: the fastest group's)
    return config.period


def outer_optimizer(config):
    """``--sync_outer_optimizer`` with ``--sync_outer_lr`` (auto: the optimizer's own default) and
    ``--sync_outer_momentum`` (auto: :func:`~tfsyncmodes.exchange.outer.momentum_for_period` of
    the period)."""
    cls = registry.OUTER_OPTIMIZERS.get(config.outer_optimizer, *knob_field(config, "outer_optimizer"))
    lr = config.outer_lr  # auto: the outer optimizer's own default
    momentum = config.outer_momentum
    if momentum == "auto":
        momentum = momentum_for_period(period(config))
    return cls(**_settings(cls, momentum=momentum, **({"lr": lr} if lr != "auto" else {})))


def elastic_alpha(config, num_groups: int) -> float:
    """The elastic coefficient for `num_groups` groups: ``--sync_elastic_alpha``, or beta / groups
    with the paper's beta = 0.9 when it is 0. A ConfigError when groups * alpha > 1."""
    alpha = None if config.elastic_alpha == "auto" else config.elastic_alpha
    try:
        return alpha_for(num_groups, alpha)
    except ValueError:
        source, field = knob_field(config, "elastic_alpha")
        raise ConfigError(source, field, f"{alpha} times {num_groups} groups is above 1 (the center would "
                                         "overshoot the groups' mean)",
                          f"use a value in (0, {1.0 / num_groups:.6g}], or 0 for {PAPER_BETA}/{num_groups}") from None


def fragments(config) -> int:
    """``--sync_fragments`` (at most the period); above 1 local steps are fixed, and an explicit
    ``--sync_local_steps=auto`` is refused (speed-proportional rounds are not staggered)."""
    count, source_field = config.fragments, knob_field(config, "fragments")
    if count > 1 and config.sources.get("local_steps", "default") != "default" and config.local_steps == "auto":
        raise ConfigError(*knob_field(config, "local_steps"), f"auto cannot run with fragments={count} (each "
                          "fragment has its own fixed schedule)", "use fixed, or fragments=1")
    if count > period(config):
        raise ConfigError(*source_field, f"{count} is above the period {period(config)} (one fragment's "
                          "exchange per step)", f"use 1 to {period(config)}, or a longer period")
    return count


def cross_group_policy(policy, config, link, warmup_steps: int) -> CrossGroupPolicy:
    """The cross-group policy class `policy` over `link`, with the settings it declares:
    ``period`` (:func:`period`), ``warmup_steps``, ``outer`` (:func:`outer_optimizer`),
    ``alpha`` (:func:`elastic_alpha`) and ``fragments`` (:func:`fragments`). Periodic averaging
    is streaming with more than one fragment, else speed-proportional with ``local_steps=auto``
    (not in an elastic run: its commits count steps, which every rank must run alike)."""
    if policy is PeriodicAverage and fragments(config) > 1:
        policy = StreamingAverage
    elif policy is PeriodicAverage and config.local_steps == "auto" and not config.elastic:
        policy = SpeedProportionalAverage
    declared = inspect.signature(policy).parameters
    settings = {"fragments": fragments(config)} if "fragments" in declared else {}
    if "period" in declared:
        settings["period"] = period(config)
    if "warmup_steps" in declared:
        settings["warmup_steps"] = warmup_steps
    if "outer" in declared:
        settings["outer"] = outer_optimizer(config)
    if "alpha" in declared:
        settings["alpha"] = elastic_alpha(config, link.num_groups)
    return policy(link, **settings)
