"""``--sync_switch_policy=straggler``: the Keras callback that measures every rank's step time,
exchanges it every ``--sync_switch_interval`` steps, and switches sync <-> hybrid.

Each rank times its steps on the host: the wall time from one step's start to the next
(`cycle`, which includes whatever the rank does between steps) and the time inside the train
function (`in_step`, which includes waiting for peers in the collective). Every window the
ranks allgather their two means (one small eager allgather through the communicators); every rank then estimates
each rank's own time per step (:func:`~tfsyncmodes.switching.decision.own_step_times`) and runs
the same :class:`~tfsyncmodes.switching.decision.StragglerDecider`, so all reach the same
decision at the same step. The chief logs every switch in one line with the figures behind it
(every decision with ``--verbosity=1``) and writes the per-rank step times and the ratio as
TensorBoard scalars (beside :class:`~tfsyncmodes.switching.callback.ModeSwitch`'s ``mode``). The
time across an epoch's end (evaluation, checkpoints) is not counted.

Groups are chosen at the switch (the slow ranks share a group): every process set a grouping
may need is registered when Horovod starts (:mod:`~tfsyncmodes.switching.candidates`), and the
hybrid exchange is rebuilt for the new groups over the optimizer variables its state already
has (the same config builds the same state, in the same order).

Limit: a rank slowed *inside* the train function (slow kernels) makes its peers wait for just
as long inside theirs, so host timing cannot tell it from them; such a straggler is seen only
once the ranks no longer wait for each other. ``--sync_slow_worker`` delays a rank between steps.
"""
from __future__ import annotations

import time
from typing import List, Optional

from absl import logging

from tfsyncmodes.exchange import groups as groups_lib
from tfsyncmodes.exchange import communicators, recipes
from tfsyncmodes.switching.callback import ModeSwitch
from tfsyncmodes.switching.decision import Decision, Groups, StragglerDecider, own_step_times


class StragglerSwitch(ModeSwitch):
    """Measures, decides every ``switch_interval`` steps and switches (see the module doc)."""

    def __init__(self, strategy, group_size: int, log_dir: Optional[str] = None):
        super().__init__(strategy, log_dir)
        config = strategy.config
        self.interval = config.switch_interval
        self.decider = StragglerDecider(config.switch_threshold, config.switch_patience, group_size)
        self.decisions: List[Decision] = []
        self._step = 0
        self._began: Optional[float] = None
        self._ended = 0.0
        self._in_step = self._cycle = 0.0
        self._timed = 0
        self._skip = 2  # the first steps trace the train function

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self._began = None  # the time across the epoch's end is not a step's

    def on_train_batch_begin(self, batch, logs=None):
        now = time.perf_counter()
        if self._began is not None and self._skip == 0:
            self._cycle += now - self._began
            self._in_step += self._ended - self._began
            self._timed += 1
        self._skip = max(self._skip - 1, 0)
        self._began = now

    def on_train_batch_end(self, batch, logs=None):
        import numpy as np

        for value in (logs or {}).values():
            np.asarray(value)  # waits for the step's result
            break
        self._ended = time.perf_counter()
        super().on_train_batch_end(batch, logs)
        self._step += 1
        if self._step % self.interval == 0:
            self._decide()

    def _decide(self) -> None:
        import tensorflow as tf

        timed = max(self._timed, 1)
        mine = tf.constant([[self._cycle / timed, self._in_step / timed, float(self._timed)]], tf.float64)
        gathered = communicators.world_allgather(mine, "tfsync_switch_policy_times").numpy()
        self._in_step = self._cycle = 0.0
        self._timed = 0
        if float(gathered[:, 2].min()) < 1:
            return  # a window without timed steps (just after a switch): nothing to judge
        decision = self.decider.observe(own_step_times(list(gathered[:, 0]), list(gathered[:, 1])))
        self.decisions.append(decision)
        if self._is_chief() and (decision.switched or logging.get_verbosity() >= logging.DEBUG):
            logging.info("tfsyncmodes: step %d: %s", self.step, decision.line())
        self._scalars(decision)
        if decision.switched:
            if decision.mode == "hybrid":
                self._regroup(decision.groups)
            self.switch_to(decision.mode, f"slowest/median {decision.ratio:.2f}")
            self._began, self._skip = None, 2  # the new train function traces first

    def _regroup(self, groups: Groups) -> None:
        """Rebuilds the hybrid exchange for `groups` over its existing state variables."""
        layout = groups_lib.GroupLayout(tuple(tuple(g) for g in groups))
        active = self.strategy.regroup(layout)
        if active is None:
            return
        hybrid = recipes.mode_exchange(recipes.mode_config(self.strategy.config, "hybrid"), active)
        self.exchange.replace("hybrid", hybrid)

    def _scalars(self, decision: Decision) -> None:
        if not (self.log_dir and self._is_chief()):
            return
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default(step=self.step):
            for rank, seconds in enumerate(decision.times):
                tf.summary.scalar(f"switch_policy/step_ms_rank_{rank}", seconds * 1000.0)
            tf.summary.scalar("switch_policy/slowest_over_median", decision.ratio)
        self._writer.flush()
