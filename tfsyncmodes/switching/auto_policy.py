"""``--sync_switch_policy=auto`` (what ``--sync_mode=auto`` runs under horovodrun): profile the
run's first steps in sync, price the modes with the cost model, switch to hybrid if it pays,
else go on as the straggler policy.

:class:`AutoSwitch` is the straggler policy's callback
(:class:`~tfsyncmodes.switching.straggler.StragglerSwitch`) with a first decision of its own:
its first :data:`PROFILE_WINDOWS` windows of ``switch_interval`` timed steps are the profile
(20 steps by default, whatever ``switch_patience``: the straggler policy's first decision
takes one window by default, too few steps to price a tail). Then one allgather of every rank's
figures, and every rank computes the same :class:`~tfsyncmodes.switching.auto.Choice`
(:func:`~tfsyncmodes.switching.auto.choose`); the chief logs one line per mode's prediction and
one with the pick. A pick of hybrid switches at that step boundary (the groups rebuilt as the
straggler policy rebuilds them) and stays: the pick priced the link as well as the straggler,
so a straggler that leaves is no reason to go back. A pick of sync leaves the run to the
straggler policy's windows from then on. A run that ends before its profile's last step trains
in sync throughout, and the chief says so in one line.
"""
from __future__ import annotations

from typing import Optional

from absl import logging

from tfsyncmodes.exchange import communicators, knob_settings, recipes
from tfsyncmodes.registry import SWITCH_PLANS
from tfsyncmodes.switching import auto
from tfsyncmodes.switching.decision import default_group_size
from tfsyncmodes.switching.policy import StragglerPlan
from tfsyncmodes.switching.straggler import StragglerSwitch

PROFILE_WINDOWS = 2  # windows of switch_interval steps in auto's profile


class AutoSwitch(StragglerSwitch):
    """Profiles, picks, then (in sync) decides as the straggler policy; see the module doc."""

    def __init__(self, strategy, group_size: int, log_dir: Optional[str] = None):
        super().__init__(strategy, group_size, log_dir)
        config = strategy.config
        self.group_size = group_size
        self.profile_steps = config.switch_interval * PROFILE_WINDOWS
        self.choice: Optional[auto.Choice] = None

    def on_train_end(self, logs=None):
        if self.choice is None and self._is_chief():
            logging.warning("tfsyncmodes: auto: the run ended after %d steps, before its %d-step profile: it trained "
                            "in sync throughout (a shorter profile: --sync_switch_interval)",
                            self._step, self.profile_steps)
        super().on_train_end(logs)

    def _decide(self, batch, policy=None):
        if self.choice is None:
            if self._step >= self.profile_steps:
                self._pick(batch)
            return  # the profile's steps accumulate over its windows
        if self.choice.mode == "hybrid":
            return  # the pick stays (module doc)
        super()._decide(batch, policy)

    def _pick(self, batch: int) -> None:
        import tensorflow as tf

        mine = tf.constant([self._window_row() + [auto.log_sigma(self._computes)]], tf.float64)
        rows = communicators.world_allgather(mine, "tfsync_auto_profile").numpy()
        self._reset_window()
        if float(rows[:, 2].min()) < 1 or float(rows[:, 3].min()) < 0:
            self.choice = auto.Choice("sync", (), "auto: sync, the straggler policy deciding from here: "
                                      "a rank timed no step or stamped no compute in the profile")
        else:
            profile = auto.profile_from_rows(rows.tolist(), _grad_bytes(self.model))
            hybrid = recipes.mode_config(self.strategy.config, "hybrid", decides_at_rounds=True)
            self.choice = auto.choose(profile, self.strategy.config.switch_threshold, self.group_size,
                                      self._host_groups(), period=knob_settings.period(hybrid),
                                      local_steps=hybrid.local_steps,
                                      epoch_steps=int((self.params or {}).get("steps") or 0))
        if self._is_chief():
            for line in self.choice.prediction_lines():
                logging.info("%s", line)
            logging.info("%s", self.choice.reason)
        if self.choice.mode == "hybrid":
            self.decider.mode, self.decider.groups = "hybrid", self.choice.groups
            self._regroup(self.choice.groups)
            self._switch("hybrid", "auto: hybrid predicted to pay", batch)


def _grad_bytes(model) -> float:
    """The bytes of the model's trainable weights (its gradient, as sync allreduces it)."""
    import numpy as np
    import tensorflow as tf

    return float(sum(int(np.prod(tuple(v.shape))) * tf.as_dtype(v.dtype).size for v in model.trainable_variables))


@SWITCH_PLANS.register("auto")
class AutoPlan(StragglerPlan):
    """``--sync_switch_policy=auto``: starts in sync, may switch to hybrid (see the module doc)."""

    policy = "auto"

    def callbacks(self, strategy):
        return [AutoSwitch(strategy, default_group_size(strategy.config, strategy.num_workers))]
