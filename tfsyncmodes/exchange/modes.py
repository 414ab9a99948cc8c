"""Which exchange chain a mode uses, decided from where the optimizer runs."""
from __future__ import annotations

import tensorflow as tf

from tfsyncmodes.errors import ConfigError, one_of
from tfsyncmodes.exchange.base import GradientTransform, chain
from tfsyncmodes.exchange.communicators import HorovodAllreduce


def horovod_world_size() -> int:
    """Size of the initialised Horovod world; 0 when Horovod is absent or not initialised."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return 0
    return hvd.size() if hvd.is_initialized() else 0


def for_mode(mode: str, config=None, **context) -> GradientTransform:
    """The exchange for `mode`, given the context the optimizer is built in.

    Under a tf.distribute strategy the strategy already reduces gradients across replicas, so
    sync adds nothing. Under Horovod (one replica per process, no strategy) sync averages with
    a grouped allreduce. A single process exchanges nothing. `config` (default: the run's, see
    :func:`tfsyncmodes.config.current`) carries the mode's knobs; `context` is what the
    optimizer shares with the mode's parts (async: the step's ``StepVersion``).
    """
    if config is None:
        from tfsyncmodes.config import current

        config = current()
    if mode == "sync":
        if tf.distribute.has_strategy() or horovod_world_size() <= 1:
            return GradientTransform()
        return chain(HorovodAllreduce())
    if mode == "hybrid":
        from tfsyncmodes.exchange.hybrid import hybrid_exchange

        return hybrid_exchange(config)
    if mode == "async":
        from tfsyncmodes.exchange.staleness import async_exchange

        return async_exchange(config, **context)
    raise ConfigError("wrap", "mode", f"{mode!r} is not accepted", one_of(("sync", "async", "hybrid")))
