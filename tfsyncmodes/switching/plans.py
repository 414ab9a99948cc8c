"""Switch plans: whether a run switches modes, between which, and what decides when.

A plan is registered in :data:`tfsyncmodes.registry.SWITCH_PLANS`; the first whose
:meth:`SwitchPlan.modes` is not empty for the run's configuration is in force. Its
:meth:`SwitchPlan.callbacks` are required callbacks of the run: each decides when to switch
and calls :meth:`tfsyncmodes.switching.callback.ModeSwitch.switch_to` (subclass ``ModeSwitch``).

A new plan (an online policy): a :class:`SwitchPlan` subclass in its own module, decorated
with ``@SWITCH_PLANS.register("name")``, with the module listed among the registry's
built-ins (or imported before ``make_strategy()``).
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence

from tfsyncmodes import schedule
from tfsyncmodes.registry import SWITCH_PLANS
from tfsyncmodes.switching.callback import ScheduleSwitch
from tfsyncmodes.switching.phases.run import PhaseRun, launched_index
from tfsyncmodes.switching.strategy import make_switching_strategy

PHASE_ENV = "TFSYNC_PHASE"  # set by the launcher in each phase of a schedule through async


class SwitchPlan:
    """Base: in force for no configuration."""

    knob = ""  # the knob that puts the plan in force (errors about the run name it)
    # Whether the plan's hybrid phase may run speed-proportional local steps: it decides at
    # cross-group rounds and leaves hybrid at an epoch's end, not at a step count that every
    # rank must have run alike.
    decides_at_rounds = False

    def modes(self, config) -> Sequence[str]:
        """The modes a run of `config` switches between, the one it starts in first
        (empty: this plan is not in force)."""
        del config
        return ()

    def callbacks(self, strategy) -> List:
        """The callbacks that switch `strategy`'s optimizers (``ModeSwitch`` subclasses)."""
        del strategy
        return []

    def phase_callback(self, strategy, model_dir: Optional[str]):
        """In a process a launcher started for one phase of this plan's run: the callback that
        runs the phase (None: not such a process)."""
        del strategy, model_dir
        return None

    def make_strategy(self, config, modes: Sequence[str], horovod, tf_config):
        """The strategy of a run this plan switches between `modes`."""
        return make_switching_strategy(config, self, modes, horovod, tf_config)


@SWITCH_PLANS.register("schedule")
class SchedulePlan(SwitchPlan):
    """``--sync_mode_schedule``: the phases of the schedule, switched at their first steps."""

    knob = "mode_schedule"

    def modes(self, config):
        if not config.mode_schedule or os.environ.get(PHASE_ENV) is not None:
            # Inside a phase the launcher runs (a schedule through async), the process trains
            # in that phase's mode only: tfsyncmodes.switching.phases switches between processes.
            return ()
        return schedule.modes(config.mode_schedule)

    def phase_callback(self, strategy, model_dir):
        """A phase of a schedule through async, started by ``python -m tfsyncmodes.launch``."""
        if launched_index() is None:
            return None
        return PhaseRun(strategy, model_dir)

    def callbacks(self, strategy):
        return [ScheduleSwitch(strategy.config.mode_schedule, strategy)]
