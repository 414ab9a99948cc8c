"""``make_strategy(mode)``: the strategy a mode needs, chosen from the configuration and from
how the process was launched (horovodrun, a TF_CONFIG cluster, or a plain process)."""
from __future__ import annotations

from typing import Optional

from tfsyncmodes import cluster as cluster_env
from tfsyncmodes import config as config_lib
from tfsyncmodes.errors import ConfigError, one_of
from tfsyncmodes.strategies.base import ModeStrategy


def sync_backend(config: config_lib.SyncConfig, horovod, tf_config) -> str:
    """The engine sync mode runs on: the configured backend, or the one ``auto`` picks."""
    if config.backend != "auto":
        return config.backend
    if horovod is not None:
        return "horovod"
    if tf_config is not None and tf_config.num_workers > 1:
        return "multi_worker"
    return "mirrored"


def make_strategy(mode: Optional[str] = None, *, backend: Optional[str] = None,
                  config: Optional[config_lib.SyncConfig] = None) -> ModeStrategy:
    """The strategy for `mode` (default: the configured one; see :mod:`tfsyncmodes.config`).

    Call it at program start, before other TensorFlow work: multi-worker strategies must be
    created first.
    """
    if config is None:
        config = config_lib.resolve({"mode": mode, "backend": backend})
    config_lib.set_current(config)
    horovod = cluster_env.horovod_env()
    tf_config = cluster_env.tf_config()

    if config.mode == "sync":
        chosen = sync_backend(config, horovod, tf_config)
        if chosen == "horovod":
            if horovod is None:
                raise ConfigError("--sync_backend", "horovod", "this process was not started by horovodrun",
                                  "launch with: horovodrun -np N python ...")
            from tfsyncmodes.strategies.horovod import HorovodStrategy

            return HorovodStrategy(config)
        if chosen == "multi_worker":
            if tf_config is None:
                raise ConfigError("--sync_backend", "multi_worker", "TF_CONFIG is not set",
                                  "set TF_CONFIG with the cluster and this task")
            from tfsyncmodes.strategies.mirrored import MultiWorkerStrategy

            return MultiWorkerStrategy(config, tf_config)
        from tfsyncmodes.strategies.mirrored import MirroredStrategy

        return MirroredStrategy(config)
    if config.mode == "hybrid":
        from tfsyncmodes.strategies.hybrid import HybridStrategy

        return HybridStrategy(config, horovod)
    if config.mode == "async":
        from tfsyncmodes.strategies.parameter_server import make_parameter_server_strategy

        return make_parameter_server_strategy(config, tf_config)
    raise ConfigError(config.sources.get("mode", "default"), "mode", f"{config.mode!r} is not accepted",
                      one_of(config_lib.MODES))


__all__ = ["ModeStrategy", "make_strategy"]
