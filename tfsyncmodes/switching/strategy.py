"""The strategy of a run that switches between sync and hybrid in-process under horovodrun
(``--sync_mode_schedule``, or another switch plan; see :mod:`tfsyncmodes.switching`).

Everything rank-related is Horovod's, as in sync and hybrid mode: this is
:class:`HorovodStrategy` with the hybrid groups' process sets declared at ``hvd.init`` (as
:class:`~tfsyncmodes.strategies.hybrid.HybridStrategy` does), one config per mode derived from
the run's, the plan, and the mode it trains in now (:attr:`mode`). Optimizers it wraps run a
:class:`~tfsyncmodes.exchange.switchable.SwitchableExchange`; the plan's callbacks switch it.
"""
from __future__ import annotations

import os
import time
from typing import List, Optional, Sequence

from absl import logging

from tfsyncmodes.cluster import HorovodEnv
from tfsyncmodes.config import SyncConfig
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange import groups as groups_lib
from tfsyncmodes.exchange.recipes import mode_config
from tfsyncmodes.keras import make_optimizer
from tfsyncmodes.keras.hybrid_callbacks import DrainExchange, WireTrafficLogger
from tfsyncmodes.strategies import horovod_restart, horovod_start
from tfsyncmodes.strategies.horovod import HorovodStrategy
from tfsyncmodes.strategies.hybrid import start_groups
from tfsyncmodes.switching.callback import ModeSwitch

IN_PROCESS = ("sync", "hybrid")  # the modes one horovodrun job can switch between


def _field(config, plan):
    """(source, field) of the knob that put `plan` in force, as errors name them."""
    knob = getattr(plan, "knob", "") or "mode_schedule"
    return config.sources.get(knob, "default"), knob


class SwitchingStrategy(HorovodStrategy):
    """Horovod ranks that train in one of `modes` at a time, starting in the first."""

    def __init__(self, config: SyncConfig, horovod_env: Optional[HorovodEnv], modes: Sequence[str],
                 plan=None):
        self.modes = tuple(modes)
        self.plan = plan
        at_rounds = bool(getattr(plan, "decides_at_rounds", False))
        self.configs = {m: mode_config(config, m, at_rounds) for m in self.modes}
        self._mode = self.modes[0]
        self.layout, self._groups = None, None
        self._sets_added = True  # the groups' process sets are Horovod's (see regroup)
        self._restarts_horovod = bool(getattr(plan, "groups_at_switch", False))
        self._restarts = None  # made at the first restart
        self.restart_seconds = 0.0  # Horovod's restarts so far, in all (the switch callback logs each)
        if "hybrid" in self.modes:
            hybrid = self.configs["hybrid"]
            self.layout = groups_lib.layout_from_config(hybrid, horovod_env.size, horovod_env.local_size)
            horovod_start.gloo_timeouts(config)  # Gloo's timeout first (no elastic switching)
            if self._restarts_horovod:
                # no process set yet: regroup brings the groups' in at the switch to hybrid
                self._groups = groups_lib.ActiveGroups(self.layout, horovod_env.rank, None, None)
                self._sets_added = False
            else:
                self._groups = start_groups(self.layout)
                one_group = groups_lib.one_group_line(self.layout, hybrid)
                if one_group and horovod_env.rank == 0:  # (a policy's groups are chosen at its switch)
                    logging.warning("%s", one_group)
        super().__init__(config)

    @property
    def mode(self) -> str:
        """The mode the run trains in now (changes at each switch)."""
        return self._mode

    def mode_switched(self, mode: str) -> None:
        """Called by the switch callback once every optimizer it drives runs `mode` (every rank
        at the same step boundary). Leaving hybrid under a plan that chooses its groups at the
        switch, Horovod restarts without the groups' process sets (see :meth:`regroup`)."""
        if mode not in self.modes:
            raise ConfigError("switch_to", "mode", f"{mode!r} is not a mode of this run",
                              "use one of: " + ", ".join(self.modes))
        self._mode = mode
        if mode != "hybrid" and self._restarts_horovod and self._sets_added:
            self._restart_horovod([])
            self._sets_added = False  # the next switch to hybrid rebuilds its exchange

    @property
    def groups(self) -> Optional[groups_lib.ActiveGroups]:
        return self._groups

    def regroup(self, layout: groups_lib.GroupLayout) -> Optional[groups_lib.ActiveGroups]:
        """Makes `layout` the hybrid groups (every rank at the same step boundary); returns the
        new groups, None if unchanged.

        Horovod negotiates every process set it knows in every cycle of its background loop,
        whether it carries traffic or not (each set about one more negotiation a cycle; dynamic
        process sets, which could add them later, cost about as much in every cycle). So a plan
        that chooses its groups at the switch (the straggler policy) runs sync with the world's
        set only, and here Horovod is shut down and started again with exactly `layout`'s sets
        (well under a second with every rank at the boundary); traced steps over the world's
        set stay valid, the hybrid exchange is rebuilt over the new sets."""
        if layout == self.layout and self._sets_added:
            return None
        if self._restarts_horovod:
            self._restart_horovod(layout.process_set_ranks())
        self.layout, self._groups = layout, groups_lib.init_horovod(layout)
        self._sets_added = True
        return self._groups

    def _restart_horovod(self, sets) -> None:
        """Horovod shut down and started again with exactly the process sets `sets` (rank lists;
        sets a script registered itself are not kept), at a rendezvous of its own
        (:mod:`~tfsyncmodes.strategies.horovod_restart`)."""
        if self._restarts is None:
            self._restarts = horovod_restart.Restarts(self.hvd)
        began = time.perf_counter()
        self._restarts.restart(self.gloo_timeouts, sets)
        self.restart_seconds += time.perf_counter() - began

    @property
    def group_index(self) -> Optional[int]:
        return self.layout.group_of(self.worker_index) if self.layout else None

    def wrap(self, optimizer, mode: Optional[str] = None, *, config: Optional[SyncConfig] = None,
             exchange=None):
        """`optimizer` wrapped with one exchange per mode of the run (see
        :class:`~tfsyncmodes.exchange.switchable.SwitchableExchange`)."""
        if mode is not None and mode not in self.modes:
            raise ConfigError("wrap(mode=...)", "mode", f"{mode!r} is not among the run's modes "
                              f"{', '.join(self.modes)}", "wrap without a mode")
        return make_optimizer(optimizer, config or self.config, self.groups, active_mode=self.mode,
                              exchange=exchange)

    def _correctness_callbacks(self) -> List:
        """Horovod's, with the plan's switch callbacks after the traffic logger (so that they
        see its logs) and before the broadcast, and the final drain."""
        drivers = self.plan.callbacks(self) if self.plan is not None else []
        base = super()._correctness_callbacks()
        traffic = [c for c in base if isinstance(c, WireTrafficLogger)]
        return traffic + drivers + [c for c in base if c not in traffic] + [DrainExchange()]

    def callbacks(self, model_dir: Optional[str] = None, checkpoint: bool = True,
                  tensorboard: bool = True) -> List:
        """As every strategy's; the chief also writes a TensorBoard marker at each switch
        under `model_dir`/logs/switches."""
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


def make_switching_strategy(config, plan, modes: Sequence[str], horovod, tf_config) -> SwitchingStrategy:
    """The strategy of a run `plan` switches between `modes` (in-process, under horovodrun)."""
    del tf_config
    source, knob = _field(config, plan)
    if "async" in modes:
        raise ConfigError(source, knob, f"{getattr(config, knob)!r} switches to or from async, which "
                          "needs another process layout than one horovodrun job",
                          "run it with python -m tfsyncmodes.launch")
    other = [m for m in modes if m not in IN_PROCESS]
    if other:
        raise ConfigError(source, knob, f"mode {other[0]!r} cannot be switched to in-process",
                          "use sync and hybrid phases")
    if horovod is None:
        raise ConfigError(source, knob, "switching between sync and hybrid within a run needs horovodrun",
                          f"launch with: horovodrun -np N python ... --sync_{knob}={getattr(config, knob)}")
    return SwitchingStrategy(config, horovod, modes, plan)
