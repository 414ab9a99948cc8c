"""The strategy of a run that switches between sync and hybrid in-process under horovodrun
(``--sync_mode_schedule``, or another switch plan; see :mod:`tfsyncmodes.switching`).

Everything rank-related is Horovod's, as in sync and hybrid mode: this is
:class:`HorovodStrategy` with the hybrid groups' process sets declared at ``hvd.init`` (as
:class:`~tfsyncmodes.strategies.hybrid.HybridStrategy` does), one config per mode derived from
the run's, the plan, and the mode it trains in now (:attr:`mode`). Optimizers it wraps run a
:class:`~tfsyncmodes.switching.exchange.SwitchableExchange`; the plan's callbacks switch it.
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence

from tfsyncmodes.cluster import HorovodEnv
from tfsyncmodes.config import SyncConfig
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange import groups as groups_lib
from tfsyncmodes.strategies.base import Mode
from tfsyncmodes.strategies.horovod import HorovodStrategy
from tfsyncmodes.strategies.hybrid import start_groups

IN_PROCESS = ("sync", "hybrid")  # the modes one horovodrun job can switch between


def _field(config, plan):
    """(source, field) of the knob that put `plan` in force, as errors name them."""
    knob = getattr(plan, "knob", "") or "mode_schedule"
    return config.sources.get(knob, "default"), knob


class SwitchingStrategy(HorovodStrategy):
    """Horovod ranks that train in one of `modes` at a time, starting in the first."""

    def __init__(self, config: SyncConfig, horovod_env: Optional[HorovodEnv], modes: Sequence[str],
                 plan=None):
        from tfsyncmodes.switching import mode_config

        self.modes = tuple(modes)
        self.plan = plan
        self.configs = {m: mode_config(config, m) for m in self.modes}
        self._mode = self.modes[0]
        self.layout, self._groups = None, None
        prepare = getattr(plan, "prepare_horovod", None)  # e.g. process sets a policy may need
        if prepare is not None and horovod_env is not None:
            prepare(config, horovod_env)
        if "hybrid" in self.modes:
            hybrid = self.configs["hybrid"]
            self.layout = groups_lib.layout_from_config(hybrid, horovod_env.size, horovod_env.local_size)
            os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(int(config.collective_timeout)))
            self._groups = start_groups(self.layout)
        super().__init__(config)

    @property
    def mode(self) -> str:
        """The mode the run trains in now (changes at each switch)."""
        return self._mode

    def mode_switched(self, mode: str) -> None:
        """Called by the switch callback once every optimizer it drives runs `mode`."""
        if mode not in self.modes:
            raise ConfigError("switch_to", "mode", f"{mode!r} is not a mode of this run",
                              "use one of: " + ", ".join(self.modes))
        self._mode = mode

    @property
    def groups(self) -> Optional[groups_lib.ActiveGroups]:
        return self._groups

    @property
    def group_index(self) -> Optional[int]:
        return self.layout.group_of(self.worker_index) if self.layout else None

    def wrap(self, optimizer, mode: Optional[str] = None, *, config: Optional[SyncConfig] = None):
        """`optimizer` wrapped with one exchange per mode of the run (see
        :class:`~tfsyncmodes.switching.exchange.SwitchableExchange`)."""
        from tfsyncmodes.keras import make_optimizer

        if mode is not None and mode not in self.modes:
            raise ConfigError("wrap(mode=...)", "mode", f"{mode!r} is not among the run's modes "
                              f"{', '.join(self.modes)}", "wrap without a mode")
        return make_optimizer(optimizer, config or self.config, self)

    def _correctness_callbacks(self) -> List:
        """Horovod's, with the plan's switch callbacks after the traffic logger (so that they
        see its logs) and before the broadcast, and the final drain."""
        from tfsyncmodes.keras.hybrid_callbacks import DrainExchange, WireTrafficLogger

        drivers = self.plan.callbacks(self) if self.plan is not None else []
        base = super()._correctness_callbacks()
        traffic = [c for c in base if isinstance(c, WireTrafficLogger)]
        return traffic + drivers + [c for c in base if c not in traffic] + [DrainExchange()]

    def callbacks(self, model_dir: Optional[str] = None, checkpoint: bool = True,
                  tensorboard: bool = True) -> List:
        """As every strategy's; the chief also writes a TensorBoard marker at each switch
        under `model_dir`/logs/switches."""
        from tfsyncmodes.keras.switching import ModeSwitch

        callbacks = super().callbacks(model_dir, checkpoint, tensorboard)
        if model_dir and tensorboard and self.is_chief:
            for callback in callbacks:
                if isinstance(callback, ModeSwitch) and callback.log_dir is None:
                    callback.log_dir = os.path.join(model_dir, "logs", "switches")
        return callbacks

    def _counts_traffic(self) -> bool:
        return "hybrid" in self.modes or self.config.compression != "none"

    def describe(self) -> str:
        text = super().describe() + f" switching={'/'.join(self.modes)}"
        if self.config.mode_schedule:
            text += f" schedule={self.config.mode_schedule}"
        if self.layout is not None:
            text += f" groups={';'.join(','.join(map(str, g)) for g in self.layout.groups)}"
        return text


class SwitchingMode(Mode):
    """Makes the switching strategy; not a registered mode (no run is "in" it), but what
    ``make_strategy()`` uses when a switch plan is in force."""

    def __init__(self, plan, modes: Sequence[str]):
        self.plan = plan
        self.modes = tuple(modes)

    def make_strategy(self, config, horovod, tf_config):
        source, knob = _field(config, self.plan)
        if "async" in self.modes:
            raise ConfigError(source, knob, f"{getattr(config, knob)!r} switches to or from async, which "
                              "needs another process layout than one horovodrun job",
                              "run it with python -m tfsyncmodes.launch")
        other = [m for m in self.modes if m not in IN_PROCESS]
        if other:
            raise ConfigError(source, knob, f"mode {other[0]!r} cannot be switched to in-process",
                              "use sync and hybrid phases")
        if horovod is None:
            raise ConfigError(source, knob, "switching between sync and hybrid within a run needs horovodrun",
                              f"launch with: horovodrun -np N python ... --{knob}=...")
        return SwitchingStrategy(config, horovod, self.modes, self.plan)

    def exchange(self, config, strategy):
        from tfsyncmodes.switching.exchange import switchable_exchange

        return switchable_exchange(self.modes, config, strategy)
