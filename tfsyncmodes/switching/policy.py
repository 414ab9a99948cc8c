"""``--sync_switch_policy=straggler`` as a switch plan: in force when the knob says so; starts in
sync and may switch to hybrid and back; starts Horovod with dynamic process sets, the groups'
added at the first switch (:mod:`~tfsyncmodes.switching.candidates`); its callback (:class:`~tfsyncmodes.switching.straggler.StragglerSwitch`)
decides when."""
from __future__ import annotations

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.registry import SWITCH_PLANS
from tfsyncmodes.strategies import horovod_start
from tfsyncmodes.switching import candidates
from tfsyncmodes.switching.plans import SwitchPlan
from tfsyncmodes.switching.straggler import StragglerSwitch


@SWITCH_PLANS.register("straggler")
class StragglerPlan(SwitchPlan):
    """``--sync_switch_policy=straggler``: starts in sync, may switch to hybrid and back."""

    knob = "switch_policy"
    policy = "straggler"  # the knob's value that puts this plan in force
    decides_at_rounds = True
    groups_at_switch = True  # the hybrid groups' process sets are added when it switches

    def modes(self, config):
        if config.switch_policy != self.policy:
            return ()
        if config.mode != "sync":
            raise ConfigError(config.sources.get("switch_policy", "default"), "switch_policy",
                              f"the {self.policy} policy starts in sync, not in {config.mode}",
                              f"use --sync_mode=sync with --sync_switch_policy={self.policy}"
                              + (" (or --sync_mode=auto)" if self.policy == "auto" else ""))
        return ("sync", "hybrid")

    def prepare_horovod(self, config, horovod_env) -> None:
        del horovod_env
        candidates.init_horovod(horovod_start.gloo_timeouts(config))

    def callbacks(self, strategy):
        return [StragglerSwitch(strategy, candidates.default_group_size(strategy.config, strategy.num_workers))]
