"""Sync mode: every step's gradients averaged over all replicas, on the backend
``--sync_backend`` names (``auto``: Horovod under horovodrun, MultiWorkerMirroredStrategy with
a TF_CONFIG of several workers, MirroredStrategy otherwise)."""
from __future__ import annotations

import tensorflow as tf

from tfsyncmodes.exchange.base import Chain
from tfsyncmodes.registry import BACKENDS, MODES
from tfsyncmodes.strategies.base import Mode


def horovod_world_size() -> int:
    """Size of the initialised Horovod world; 0 when Horovod is absent or not initialised."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return 0
    return hvd.size() if hvd.is_initialized() else 0


def chosen_backend(config, horovod, tf_config) -> str:
    """The engine sync mode runs on: the configured backend, or the one ``auto`` picks."""
    if config.backend != "auto":
        return config.backend
    if horovod is not None:
        return "horovod"
    if tf_config is not None and tf_config.num_workers > 1:
        return "multi_worker"
    return "mirrored"


@MODES.register("sync")
class SyncMode(Mode):
    def make_strategy(self, config, horovod, tf_config):
        backend = BACKENDS.get(chosen_backend(config, horovod, tf_config),
                               config.sources.get("backend", "default"), "backend")
        return backend.from_environment(config, horovod, tf_config)

    def exchange(self, config, strategy):
        """Under a tf.distribute strategy the strategy reduces gradients itself, so nothing;
        under Horovod (one replica per process) one grouped allreduce per step, or with
        ``--sync_compression`` the compressed exchange (its error feedback is optimizer state)."""
        size = horovod_world_size()
        if tf.distribute.has_strategy() or size <= 1:
            return Chain()
        if config.compression != "none":
            import horovod.tensorflow as hvd

            from tfsyncmodes.exchange.compressed_allreduce import compressed_allreduce

            return Chain(compressed_allreduce(config, hvd.rank(), size))
        from tfsyncmodes.exchange.communicators import HorovodAllreduce

        return Chain(HorovodAllreduce())
