"""Keras integration: the optimizer wrapper, the callbacks, and the fit-like loop."""
from tfsyncmodes.keras import compat


def wrap(optimizer, mode=None):
    """Wraps a Keras optimizer so that each step's gradients go through `mode`'s exchange.

    `mode` defaults to the configured one (flags, environment, config file). The mode's knobs
    are those of :func:`tfsyncmodes.config.current` at the time of wrapping, so models wrapped
    under different configurations in one process keep their own. Returns a Keras 3
    :class:`~tfsyncmodes.keras.optimizer.SyncOptimizer`, or under ``TF_USE_LEGACY_KERAS=1`` a
    tf_keras optimizer of the same class with the exchange in ``apply_gradients``.
    """
    if mode is None:
        from tfsyncmodes.config import resolve

        mode = resolve().mode
    if compat.LEGACY:
        from tfsyncmodes.keras import legacy_optimizer

        return legacy_optimizer.wrap(optimizer, mode)
    from tfsyncmodes.keras.optimizer import SyncOptimizer

    return SyncOptimizer(optimizer, mode=mode)
