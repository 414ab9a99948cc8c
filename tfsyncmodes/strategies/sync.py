"""Sync mode: every step's gradients averaged over all replicas, on the backend
``--sync_backend`` names (``auto``: Horovod under horovodrun, MultiWorkerMirroredStrategy with
a TF_CONFIG of several workers, MirroredStrategy otherwise)."""
from __future__ import annotations

from tfsyncmodes.registry import BACKENDS, MODES
from tfsyncmodes.strategies.base import Mode


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
