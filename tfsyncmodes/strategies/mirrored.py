"""Sync over tf.distribute: MirroredStrategy on one host, MultiWorkerMirroredStrategy across
the workers of a TF_CONFIG cluster. The strategies reduce gradients themselves, so
``SyncOptimizer`` adds no exchange under them."""
from __future__ import annotations

import tensorflow as tf

from tfsyncmodes.cluster import TFConfig
from tfsyncmodes.config import SyncConfig
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.keras import compat
from tfsyncmodes.keras.loop import StrategyRunner, fit_loop
from tfsyncmodes.registry import BACKENDS
from tfsyncmodes.strategies import devices
from tfsyncmodes.strategies.base import ModeStrategy
from tfsyncmodes.watchdog import deadline


@BACKENDS.register("multi_worker")
class MultiWorkerStrategy(ModeStrategy):
    """One process per TF_CONFIG task (``chief`` and ``worker`` roles)."""

    backend = "multi_worker"

    @classmethod
    def from_environment(cls, config, horovod, tf_config):
        refuse_compression(config, cls.backend)
        if tf_config is None:
            raise ConfigError("--sync_backend", "multi_worker", "TF_CONFIG is not set",
                              "set TF_CONFIG with the cluster and this task")
        return cls(config, tf_config)

    def __init__(self, config: SyncConfig, cluster: TFConfig):
        cluster.require_roles("sync", allowed=("chief", "worker"), required=())
        self.cluster = cluster
        self.device_plan = devices.place(devices.ALL_LOCAL)  # every local GPU, memory growth on
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=config.collective_timeout)
        peers = ", ".join(a for role in ("chief", "worker") for a in cluster.cluster.get(role, ()))
        # The strategy waits for every worker before it returns, beyond any collective timeout.
        with deadline(config.collective_timeout, "connecting to the TF_CONFIG workers",
                      f"start every task of the cluster ({peers}) or raise --sync_collective_timeout"):
            strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        super().__init__(config, strategy)

    @property
    def is_chief(self) -> bool:
        return self.cluster.is_chief

    def _backup_writes(self):
        return None if compat.LEGACY else self.is_chief  # tf_keras coordinates its own writers

    @property
    def worker_index(self) -> int:
        offset = 1 if self.cluster.task_type == "worker" and "chief" in self.cluster.cluster else 0
        return self.cluster.task_index + offset

    @property
    def num_workers(self) -> int:
        return self.cluster.num_workers

    def fit(self, model, dataset_fn, *, epochs=1, steps_per_epoch=None, callbacks=(), verbose=None,
            input_options=None):
        """tf_keras trains with ``model.fit``; Keras 3's ``fit`` fails under this strategy, so
        Keras 3 models train in tfsyncmodes' own fit-like loop."""
        if compat.LEGACY:
            return super().fit(model, dataset_fn, epochs=epochs, steps_per_epoch=steps_per_epoch,
                               callbacks=callbacks, verbose=verbose, input_options=input_options)
        return fit_loop(model, StrategyRunner(self, dataset_fn, input_options), epochs=epochs,
                        steps_per_epoch=steps_per_epoch,
                        callbacks=self.with_required_callbacks(callbacks),
                        verbose=self.default_verbose() if verbose is None else verbose)


@BACKENDS.register("mirrored")
class MirroredStrategy(ModeStrategy):
    backend = "mirrored"

    @classmethod
    def from_environment(cls, config, horovod, tf_config):
        refuse_compression(config, cls.backend)
        return cls(config)

    def __init__(self, config: SyncConfig):
        self.device_plan = devices.place(devices.ALL_LOCAL)  # every local GPU, memory growth on
        super().__init__(config, tf.distribute.MirroredStrategy())


def refuse_compression(config, backend: str) -> None:
    """tf.distribute's strategies reduce gradients themselves; their CommunicationOptions choose
    the collective implementation (ring, NCCL), not a compression."""
    if config.compression != "none":
        raise ConfigError(config.sources.get("compression", "default"), "compression",
                          f"{config.compression!r} is not available with the {backend} backend, whose "
                          "tf.distribute strategy reduces full-precision gradients itself",
                          "run under horovodrun (--sync_backend=horovod), or use --sync_compression=none")
