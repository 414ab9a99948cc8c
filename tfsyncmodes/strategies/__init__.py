"""``make_strategy(mode)``: the strategy a mode needs, chosen from the configuration and from
how the process was launched (horovodrun, a TF_CONFIG cluster, or a plain process).

Which strategy a mode makes is the mode's own decision (:class:`~tfsyncmodes.strategies.base.Mode`
in :data:`tfsyncmodes.registry.MODES`); this function only resolves the config and looks it up.
"""
from __future__ import annotations

from typing import Optional

from tfsyncmodes import cluster as cluster_env
from tfsyncmodes import config as config_lib
from tfsyncmodes import registry
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange.recipes import switch_plan
from tfsyncmodes.strategies.base import Mode, ModeStrategy


def make_strategy(mode: Optional[str] = None, *, backend: Optional[str] = None,
                  config: Optional[config_lib.SyncConfig] = None, **knobs) -> ModeStrategy:
    """The strategy for `mode` (default: the configured one; see :mod:`tfsyncmodes.config`).

    Any other knob may be given as a keyword argument, as in
    ``make_strategy("hybrid", staleness=7, compression="topk")``: code arguments take
    precedence over flags, environment and config file, and are checked by the same parsers
    (an unknown knob or a bad value is one :class:`~tfsyncmodes.errors.ConfigError`). `config`
    (a resolved :class:`~tfsyncmodes.config.SyncConfig`) is used as it is and excludes them.

    Call it at program start, before other TensorFlow work: multi-worker strategies must be
    created first. The strategy holds the resolved config; wrap optimizers with
    ``strategy.wrap(optimizer)`` or, inside ``strategy.scope()``, ``tfsyncmodes.wrap``.
    """
    if config is None:
        config = config_lib.resolve({"mode": mode, "backend": backend, **knobs})
    else:
        given = dict(knobs, mode=None if mode == config.mode else mode, backend=backend)
        extra = sorted(k for k, v in given.items() if v is not None)
        if extra:
            raise ConfigError("make_strategy(config=...)", ", ".join(extra), "given beside a resolved config",
                              "put them in the config: tfsyncmodes.resolve({...})")
    planned = switch_plan(config)  # a run that switches modes (--sync_mode_schedule, a switch policy)
    if planned is not None:
        plan, modes = planned
        return plan.make_strategy(config, modes, cluster_env.horovod_env(), cluster_env.tf_config())
    mode_part = registry.MODES.get(config.mode, config.sources.get("mode", "default"), "mode")()
    return mode_part.make_strategy(config, cluster_env.horovod_env(), cluster_env.tf_config())


__all__ = ["Mode", "ModeStrategy", "make_strategy"]
