"""``--switch_policy=straggler``: the Keras callback that measures every rank's step time,
exchanges it every ``--switch_interval`` steps, and switches sync <-> hybrid.

Each rank times its steps on the host: the wall time from one step's start to the next
(`cycle`, which includes whatever the rank does between steps) and the time inside the train
function (`in_step`, which includes waiting for peers in the collective). Every window the
ranks allgather their two means (one small eager ``hvd.allgather``); every rank then estimates
each rank's own time per step (:func:`~tfsyncmodes.switching.decision.own_step_times`) and runs
the same :class:`~tfsyncmodes.switching.decision.StragglerDecider`, so all reach the same
decision at the same step. The chief logs every decision in one line and writes the per-rank
step times, the ratio and the mode (0 sync, 1 hybrid) as TensorBoard scalars.

Limit: a rank slowed *inside* the train function (slow kernels) makes its peers wait for just
as long inside theirs, so host timing cannot tell it from them; such a straggler is seen only
once the ranks no longer wait for each other. ``--slow_worker`` delays a rank between steps.
"""
from __future__ import annotations

import time
from typing import Callable, List, Optional

from absl import logging

from tfsyncmodes.keras.compat import keras
from tfsyncmodes.switching.decision import Decision, StragglerDecider, own_step_times


class StragglerSwitch(keras.callbacks.Callback):
    """Measures, decides and calls ``switch(mode, groups)`` at a step boundary when the decider
    says so. `log_dir`: the chief's TensorBoard directory (None: no scalars)."""

    def __init__(self, config, hvd, switch: Callable[[str, tuple], None], group_size: int,
                 log_dir: Optional[str] = None):
        super().__init__()
        self.hvd = hvd
        self.switch = switch
        self.interval = config.switch_interval
        self.decider = StragglerDecider(config.switch_threshold, config.switch_patience, group_size)
        self.log_dir = log_dir
        self.decisions: List[Decision] = []
        self._writer = None
        self._step = 0
        self._began = None
        self._in_step = self._cycle = 0.0
        self._timed = 0
        self._skip = 2  # the first steps trace the train function

    def on_train_begin(self, logs=None):
        if self.log_dir and self.hvd.rank() == 0:
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(self.log_dir)

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
        self._step += 1
        if self._step % self.interval == 0:
            self._decide()

    def _decide(self) -> None:
        import tensorflow as tf

        timed = max(self._timed, 1)
        mine = tf.constant([[self._cycle / timed, self._in_step / timed, float(self._timed)]], tf.float64)
        gathered = self.hvd.allgather(mine, name="tfsync_switch_policy_times").numpy()
        self._in_step = self._cycle = 0.0
        self._timed = 0
        if float(gathered[:, 2].min()) < 1:
            return  # a window without timed steps (just after a switch): nothing to judge
        times = own_step_times(list(gathered[:, 0]), list(gathered[:, 1]))
        decision = self.decider.observe(times)
        self.decisions.append(decision)
        if self.hvd.rank() == 0 and (decision.switched or logging.get_verbosity() >= logging.DEBUG):
            logging.info("step %d: %s", self._step, decision.line())
        self._write(decision)
        if decision.switched:
            self.switch(decision.mode, decision.groups)
            self._skip = 2  # the new mode's train function traces on its first step

    def _write(self, decision: Decision) -> None:
        if self._writer is None:
            return
        import tensorflow as tf

        with self._writer.as_default(step=self._step):
            for rank, seconds in enumerate(decision.times):
                tf.summary.scalar(f"switch_policy/step_ms_rank_{rank}", seconds * 1000.0)
            tf.summary.scalar("switch_policy/slowest_over_median", decision.ratio)
            tf.summary.scalar("switch_policy/hybrid", 1.0 if decision.mode == "hybrid" else 0.0)
        self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
