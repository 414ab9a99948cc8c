"""Sync mode: every step's gradients averaged over all replicas, on the backend
``--sync_backend`` names (``auto``: Horovod under horovodrun, MultiWorkerMirroredStrategy with
a TF_CONFIG of several workers, MirroredStrategy otherwise)."""
from __future__ import annotations

import os

from tfsyncmodes.config import field_of
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.knobs import KNOBS_BY_KEY
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
        chosen = chosen_backend(config, horovod, tf_config)
        if config.elastic:
            check_elastic(config, chosen)
        backend = BACKENDS.get(chosen, config.sources.get("backend", "default"), "backend")
        return backend.from_environment(config, horovod, tf_config)


def check_elastic(config, backend: str) -> None:
    """``elastic`` needs Horovod started by ``horovodrun`` in its elastic mode (which sets
    ``HOROVOD_ELASTIC=1`` in every rank's environment)."""
    source = config.sources.get("elastic", "default")
    field = field_of(KNOBS_BY_KEY["elastic"], source)
    fix = ("launch with: horovodrun -np N --min-np N --max-np M --host-discovery-script SCRIPT python ..., "
           "or turn elastic off")
    if backend != "horovod":
        raise ConfigError(source, field, f"needs the horovod backend, not {backend}", fix)
    if os.environ.get("HOROVOD_ELASTIC") != "1":
        raise ConfigError(source, field, "horovodrun is not in elastic mode", fix)
