"""Keras integration: the optimizer wrappers, the callbacks, and the fit-like loop."""
from __future__ import annotations

from typing import Optional

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.keras import compat


def wrap(optimizer, mode: Optional[str] = None, *, config=None):
    """Wraps a Keras optimizer so that each step's update goes through a mode's exchange.

    The exchange is built from the strategy whose scope is active, else the strategy made
    last in this process (``strategy.wrap``), else a configuration resolved now from flags,
    environment and config file. `config` (a :class:`~tfsyncmodes.config.SyncConfig`) gives
    one model other knobs of the strategy's mode. A `mode` that contradicts the strategy's is
    an error. Returns a Keras 3 :class:`~tfsyncmodes.keras.optimizer.SyncOptimizer`, or under
    ``TF_USE_LEGACY_KERAS=1`` a tf_keras optimizer of the same class with the exchange in
    ``apply_gradients``.
    """
    from tfsyncmodes.config import resolve
    from tfsyncmodes.strategies.base import ModeStrategy

    strategy = ModeStrategy.current()
    if config is not None and mode is not None and mode != config.mode:
        raise ConfigError("wrap(mode=...)", "mode", f"{mode!r} contradicts wrap(config=...)'s mode "
                          f"{config.mode!r}", "give one of the two")
    if strategy is not None and (config is None or ModeStrategy.in_scope()
                                 or strategy.mode == config.mode):
        return strategy.wrap(optimizer, mode, config=config)
    return make_optimizer(optimizer, config or resolve({"mode": mode}), None)


def make_optimizer(optimizer, config, strategy):
    """The wrapper for the Keras in use, with its exchange built from `config` and `strategy`."""
    from tfsyncmodes.keras.core import SyncCore

    core = SyncCore(config, strategy)
    if compat.LEGACY:
        from tfsyncmodes.keras import legacy_optimizer

        return legacy_optimizer.wrap(optimizer, core)
    from tfsyncmodes.keras.optimizer import SyncOptimizer

    return SyncOptimizer(optimizer, core=core)


def default_core():
    """The exchange an optimizer wrapped with no arguments gets (see :func:`wrap`)."""
    from tfsyncmodes.config import resolve
    from tfsyncmodes.keras.core import SyncCore
    from tfsyncmodes.strategies.base import ModeStrategy

    strategy = ModeStrategy.current()
    return SyncCore(strategy.config if strategy else resolve(), strategy)
