"""What the Keras 3 and tf_keras optimizer wrappers share: the config, the strategy and the
exchange built from them, and the order in which a step runs the exchange's stages.

    begin_step()                          # before the forward pass (async: version read)
    grads = exchange.transform(grads)     # clip, compress, exchange, decompress
    exchange.before_update(variables)
    inner optimizer's update
    exchange.after_update(variables)      # model averaging stages

Neither wrapper knows which mode it runs: the exchange does, built by
:func:`tfsyncmodes.exchange.recipes.exchange_for` (or composed by the user). Which strategy is
in force comes from :mod:`tfsyncmodes.context`; this module imports no strategy.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import tensorflow as tf

from tfsyncmodes import config as config_lib
from tfsyncmodes import context
from tfsyncmodes.exchange.base import Chain, StateFactory, reuse_state
from tfsyncmodes.exchange.recipes import exchange_for
from tfsyncmodes.keras import compat


# The saved knobs' entry listing the knobs left at their default (not a knob itself).
DEFAULTED = "defaulted_knobs"


class SyncCore:
    """One wrapped optimizer's exchange, built from exactly `config` over the strategy's
    `groups` (hybrid process sets; None: none), or the `exchange` a user composed."""

    def __init__(self, config, groups=None, *, active_mode: Optional[str] = None,
                 exchange: Optional[Chain] = None):
        self.config = config
        self.exchange: Chain = exchange if exchange is not None else exchange_for(
            config, groups, active_mode=active_mode)
        self.variables: Sequence = ()
        self.state: list = []  # (name, variable) of every state variable the exchange made

    @classmethod
    def default(cls) -> "SyncCore":
        """The exchange an optimizer constructed with no core gets: the strategy in scope's,
        else one from a configuration resolved now."""
        strategy = context.current()
        if strategy is not None:
            return cls(strategy.config, strategy.groups, active_mode=strategy.mode)
        return cls(config_lib.resolve())

    @classmethod
    def from_saved(cls, knobs: Mapping[str, Any]) -> "SyncCore":
        """The core a loaded model's optimizer gets: the saved knobs, over the groups of the
        strategy in scope if it runs the same mode (else none: the exchange keeps its state,
        unused)."""
        config = config_lib.from_saved(knobs)
        defaulted = [k for k in knobs.get(DEFAULTED, ()) if k in config.sources]
        if defaulted:  # knobs a switching run derives per mode
            config = dataclasses.replace(config, sources={**config.sources, **{k: "default" for k in defaulted}})
        strategy = context.current()
        if config.mode_schedule:  # a switching run's optimizer: the strategy of the same schedule
            same = strategy is not None and strategy.config.mode_schedule == config.mode_schedule
        else:
            same = strategy is not None and strategy.mode == config.mode
        if not same:
            return cls(config)
        return cls(config, strategy.groups, active_mode=strategy.mode)

    @property
    def mode(self) -> str:
        return self.config.mode

    def attach(self, inner_optimizer) -> None:
        self.inner_optimizer = inner_optimizer
        self.exchange.attach(inner_optimizer)

    def build(self, variables: Sequence, state: StateFactory) -> None:
        self.variables = list(variables)

        def recorded(name, shape, dtype):
            variable = state(name, shape, dtype)
            self.state.append((name, variable))
            return variable
        self.exchange.build(self.variables, recorded)

    def regroup(self, groups) -> None:
        """The exchange made again over other hybrid `groups` (an elastic job's new world),
        built over the state variables the old one made, name for name (they are optimizer
        state: the elastic commit, checkpoints and broadcasts know them). The train function
        must be traced again."""
        exchange = exchange_for(self.config, groups, active_mode=getattr(self.exchange, "active", None))
        if getattr(self, "inner_optimizer", None) is not None:
            exchange.attach(self.inner_optimizer)
        if self.variables:
            exchange.build(self.variables, reuse_state(self.state, "regrouped exchange"))
        self.exchange = exchange

    def start_clean(self, kept: Sequence[str]) -> None:
        """Every state variable of the exchange set to zero, except those named in `kept`
        (as at the start of training: round policies take their anchor again at the next step)."""
        for name, variable in self.state:
            if name not in kept:
                variable.assign(tf.zeros_like(variable))

    def begin_step(self) -> tf.Tensor:
        read = self.exchange.begin_step()
        return read if read is not None else tf.zeros((), tf.int64)

    def apply(self, grads, variables, inner_apply: Callable[[list], Any]):
        grads = self.exchange.transform(list(grads), variables)
        self.exchange.before_update(variables)
        scale = self.exchange.update_scale()  # e.g. staleness with an adaptive optimizer
        if scale is None:
            result = inner_apply(grads)
        else:
            with scaled_learning_rate(self.inner_optimizer, scale):
                result = inner_apply(grads)
        self.exchange.after_update(variables)
        return result

    def step_logs(self) -> Dict[str, tf.Tensor]:
        return self.exchange.step_logs()

    def finish(self) -> None:
        """End of training: drain background rounds, then end with one model."""
        self.exchange.flush()
        self.exchange.finish(self.variables)

    def get_config(self) -> Dict[str, Any]:
        values = config_lib.knob_values(self.config)
        values[DEFAULTED] = sorted(k for k in values if self.config.sources.get(k, "default") == "default")
        return values


class SyncCoreAccess:
    """What both wrappers show of their core (``self._sync_core``)."""

    _sync_core: SyncCore = None

    @property
    def mode(self) -> str:
        return self._sync_core.mode

    @property
    def sync_config(self):
        """The knobs this optimizer's exchange was built with."""
        return self._sync_core.config

    @property
    def exchange(self) -> Chain:
        return self._sync_core.exchange

    def begin_step(self):
        """Marks the step's read of the variables; the step's forward pass must depend on the
        returned tensor (async staleness)."""
        return self._sync_core.begin_step()

    @property
    def step_staleness(self):
        return self._sync_core.step_logs().get("staleness")

    def finish_exchange(self) -> None:
        self._sync_core.finish()

    @property
    def sync_core(self) -> SyncCore:
        return self._sync_core


@contextlib.contextmanager
def scaled_learning_rate(optimizer, scale: tf.Tensor):
    """While the inner optimizer's update is traced: its learning rate for this step times
    `scale` (a schedule's value at this step, or the rate's variable, read once), so that the
    update, not the gradient, is scaled; the optimizer's own rate is untouched."""
    original = optimizer._learning_rate
    if compat.LEGACY:  # tf_keras reads `learning_rate`, which returns `_learning_rate` as it is
        schedule = isinstance(original, compat.keras.optimizers.schedules.LearningRateSchedule)
        current = original(optimizer.iterations) if schedule else original
    else:  # Keras 3 reads `_get_current_learning_rate()`, which calls a callable
        current = optimizer._get_current_learning_rate()
    scaled = tf.cast(tf.convert_to_tensor(current), tf.float32) * tf.cast(scale, tf.float32)
    optimizer._learning_rate = scaled if compat.LEGACY else (lambda: scaled)
    try:
        yield
    finally:
        optimizer._learning_rate = original


def state_factory(add_variable: Callable[..., Any]) -> StateFactory:
    """A StateFactory over an optimizer's ``add_variable(shape, dtype, initializer, name)``."""
    def state(name: str, shape, dtype: tf.DType):
        return add_variable(shape=tuple(shape), dtype=tf.as_dtype(dtype).name, initializer="zeros",
                            name=name)
    return state


def saved_core(config: Dict[str, Any]) -> Optional[SyncCore]:
    """Pops the wrapper's keys from an optimizer config and rebuilds its core (older saves
    carry only the mode)."""
    knobs = config.pop("tfsync_knobs", None)
    mode = config.pop("mode", None) or config.pop("sync_mode", None)
    if knobs is None and mode is None:
        return None
    return SyncCore.from_saved(knobs if knobs is not None else {"mode": mode})
