"""``--sync_switch_policy=straggler`` as a switch plan: in force when the knob says so; starts in
sync and may switch to hybrid and back; Horovod starts without the hybrid groups' process sets,
which the strategy brings in at each switch to hybrid and drops at each switch back
(:meth:`~tfsyncmodes.switching.strategy.SwitchingStrategy.regroup`); its callback
(:class:`~tfsyncmodes.switching.straggler.StragglerSwitch`) decides when."""
from __future__ import annotations

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.registry import SWITCH_PLANS
from tfsyncmodes.switching.decision import default_group_size
from tfsyncmodes.switching.plans import SwitchPlan
from tfsyncmodes.switching.straggler import StragglerSwitch


@SWITCH_PLANS.register("straggler")
class StragglerPlan(SwitchPlan):
    """``--sync_switch_policy=straggler``: starts in sync, may switch to hybrid and back."""

    knob = "switch_policy"
    policy = "straggler"  # the knob's value that puts this plan in force
    decides_at_rounds = True
    groups_at_switch = True  # the hybrid groups' process sets only while it trains in hybrid

    def modes(self, config):
        if config.switch_policy != self.policy:
            return ()
        if config.mode != "sync":
            raise ConfigError(config.sources.get("switch_policy", "default"), "switch_policy",
                              f"the {self.policy} policy starts in sync, not in {config.mode}",
                              f"use --sync_mode=sync with --sync_switch_policy={self.policy}"
                              + (" (or --sync_mode=auto)" if self.policy == "auto" else ""))
        return ("sync", "hybrid")

    def callbacks(self, strategy):
        return [StragglerSwitch(strategy, default_group_size(strategy.config, strategy.num_workers))]
