"""What the Keras 3 and tf_keras optimizer wrappers share: the config, the strategy and the
exchange built from them, and the order in which a step runs the exchange's stages.

    begin_step()                          # before the forward pass (async: version read)
    grads = exchange.transform(grads)     # clip, compress, exchange, decompress
    exchange.before_update(variables)
    inner optimizer's update
    exchange.after_update(variables)      # model averaging stages

Neither wrapper knows which mode it runs: the mode's exchange does (``Mode.exchange``).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import tensorflow as tf

from tfsyncmodes import config as config_lib
from tfsyncmodes import registry
from tfsyncmodes.exchange.base import Chain, StateFactory


# The saved knobs' entry listing the knobs left at their default (not a knob itself).
DEFAULTED = "defaulted_knobs"


class SyncCore:
    """One wrapped optimizer's exchange, built from exactly `config` (and `strategy`'s groups)."""

    def __init__(self, config, strategy=None):
        self.config = config
        self.strategy = strategy
        self.exchange: Chain = exchange_for(config, strategy)
        self.variables: Sequence = ()

    @classmethod
    def from_saved(cls, knobs: Mapping[str, Any]) -> "SyncCore":
        """The core a loaded model's optimizer gets: the saved knobs, and the strategy in force
        now if it runs the same mode (else none: the exchange keeps its state, unused)."""
        from tfsyncmodes.strategies.base import ModeStrategy

        config = config_lib.from_saved(knobs)
        defaulted = [k for k in knobs.get(DEFAULTED, ()) if k in config.sources]
        if defaulted:  # knobs a switching run derives per mode (Knob.mode_defaults)
            config = dataclasses.replace(config, sources={**config.sources, **{k: "default" for k in defaulted}})
        strategy = ModeStrategy.current()
        if config.mode_schedule:  # a switching run's optimizer: the strategy of the same schedule
            same = strategy is not None and strategy.config.mode_schedule == config.mode_schedule
        else:
            same = strategy is not None and strategy.mode == config.mode
        return cls(config, strategy if same else None)

    @property
    def mode(self) -> str:
        return self.config.mode

    def attach(self, inner_optimizer) -> None:
        self.exchange.attach(inner_optimizer)

    def build(self, variables: Sequence, state: StateFactory) -> None:
        self.variables = list(variables)
        self.exchange.build(self.variables, state)

    def begin_step(self) -> tf.Tensor:
        read = self.exchange.begin_step()
        return read if read is not None else tf.zeros((), tf.int64)

    def apply(self, grads, variables, inner_apply: Callable[[list], Any]):
        grads = self.exchange.transform(list(grads), variables)
        self.exchange.before_update(variables)
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


def exchange_for(config, strategy) -> Chain:
    """The mode's exchange; when a switch plan is in force (``--sync_mode_schedule``), one exchange
    per mode of the plan behind a holder that runs the active one."""
    from tfsyncmodes import switching

    planned = switching.plan_for(config)
    if planned is not None:
        from tfsyncmodes.strategies.scheduled import SwitchingMode

        return SwitchingMode(*planned).exchange(config, strategy)
    mode = registry.MODES.get(config.mode, config.sources.get("mode", "argument"), "mode")()
    return mode.exchange(config, strategy)


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
