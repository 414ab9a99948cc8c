"""Keras integration: the optimizer wrappers, the callbacks, and the fit-like loop.

This package sits below :mod:`tfsyncmodes.strategies`: it never imports a strategy. What a
mode exchanges comes from :func:`tfsyncmodes.exchange.recipes.exchange_for`; which strategy is
in force comes from :mod:`tfsyncmodes.context` (the scope this thread is in).
"""
from __future__ import annotations

from typing import Optional

from tfsyncmodes import context
from tfsyncmodes.config import resolve
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.keras import compat
from tfsyncmodes.keras.core import SyncCore

if compat.LEGACY:
    from tfsyncmodes.keras import legacy_optimizer as _wrapper
else:
    from tfsyncmodes.keras import optimizer as _wrapper


def wrap(optimizer, mode: Optional[str] = None, *, config=None, exchange=None):
    """Wraps a Keras optimizer so that each step's update goes through a mode's exchange.

    Inside ``strategy.scope()`` the exchange is built from that strategy (``strategy.wrap``).
    Outside every scope the configuration is resolved now from `mode`, the flags, the
    environment and the config file (a mode that needs a strategy's groups, as hybrid in a
    multi-rank job, is then an error saying to wrap inside the strategy's scope). `config` (a
    :class:`~tfsyncmodes.config.SyncConfig`) gives one model other knobs of the strategy's
    mode; `exchange` (a :class:`~tfsyncmodes.exchange.base.Chain` of parts a user composed)
    replaces the mode's recipe. A `mode` that contradicts the strategy's is an error. Returns
    a Keras 3 :class:`~tfsyncmodes.keras.optimizer.SyncOptimizer`, or under
    ``TF_USE_LEGACY_KERAS=1`` a tf_keras optimizer of the same class with the exchange in
    ``apply_gradients``.
    """
    if config is not None and mode is not None and mode != config.mode:
        raise ConfigError("wrap(mode=...)", "mode", f"{mode!r} contradicts wrap(config=...)'s mode "
                          f"{config.mode!r}", "give one of the two")
    strategy = context.current()
    if strategy is not None:
        return strategy.wrap(optimizer, mode, config=config, exchange=exchange)
    return make_optimizer(optimizer, config or resolve({"mode": mode}), exchange=exchange)


def make_optimizer(optimizer, config, groups=None, *, active_mode: Optional[str] = None, exchange=None):
    """The wrapper for the Keras in use, its exchange built from `config` over `groups` (or
    the given `exchange`)."""
    return _wrapper.wrap(optimizer, SyncCore(config, groups, active_mode=active_mode, exchange=exchange))
