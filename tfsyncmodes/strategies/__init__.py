"""``make_strategy(mode)``: the strategy a mode needs, chosen from the configuration and from
how the process was launched (horovodrun, a TF_CONFIG cluster, or a plain process).

Which strategy a mode makes is the mode's own decision (:class:`~tfsyncmodes.strategies.base.Mode`
in :data:`tfsyncmodes.registry.MODES`); this function only resolves the config and looks it up.
"""
from __future__ import annotations

from typing import Optional

from tfsyncmodes import cluster as cluster_env
from tfsyncmodes import config as config_lib
from tfsyncmodes import registry, switching
from tfsyncmodes.strategies.base import Mode, ModeStrategy


def make_strategy(mode: Optional[str] = None, *, backend: Optional[str] = None,
                  config: Optional[config_lib.SyncConfig] = None) -> ModeStrategy:
    """The strategy for `mode` (default: the configured one; see :mod:`tfsyncmodes.config`).

    Call it at program start, before other TensorFlow work: multi-worker strategies must be
    created first. The strategy holds the resolved config; wrap optimizers with
    ``strategy.wrap(optimizer)`` or, inside ``strategy.scope()``, ``tfsyncmodes.wrap``.
    """
    if config is None:
        config = config_lib.resolve({"mode": mode, "backend": backend})
    planned = switching.plan_for(config)  # a run that switches modes (--sync_mode_schedule)
    if planned is not None:
        from tfsyncmodes.strategies.scheduled import SwitchingMode

        return SwitchingMode(*planned).make_strategy(config, cluster_env.horovod_env(), cluster_env.tf_config())
    mode_part = registry.MODES.get(config.mode, config.sources.get("mode", "default"), "mode")()
    return mode_part.make_strategy(config, cluster_env.horovod_env(), cluster_env.tf_config())


__all__ = ["Mode", "ModeStrategy", "make_strategy"]
