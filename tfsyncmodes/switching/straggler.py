"""``--sync_switch_policy=straggler``: the Keras callback that measures every rank's step time,
exchanges it every ``--sync_switch_interval`` steps, and switches sync <-> hybrid.

Each rank times its steps on the host: the wall time from one step's start to the next
(`cycle`, which includes whatever the rank does between steps) and the time inside the train
function (`in_step`, which includes waiting for peers in the collective), and takes its compute
from each step (below). Every window the ranks allgather their means and their latest
:data:`STEPS_GATHERED` computes one by one (one small eager allgather through the
communicators); every rank then works out each rank's own time per step
(:func:`~tfsyncmodes.switching.decision.own_step_times`) and sync's mean step over the window
(:func:`~tfsyncmodes.switching.decision.sync_step`) and runs the same
:class:`~tfsyncmodes.switching.decision.StragglerDecider`, so all reach the same decision at the
same step. The chief logs every switch in one line with the figures behind it
(every decision with ``--verbosity=1``) and writes the per-rank step times and the ratio as
TensorBoard scalars (beside :class:`~tfsyncmodes.switching.callback.ModeSwitch`'s ``mode``). The
time across an epoch's end (evaluation, checkpoints) is not counted.

Groups are chosen at the switch: the run's hosts when it spans hosts that are groups of the
policy's size (the slowest rank's host first; a group's every-step exchange stays inside a
host), else the slow ranks share a group. Horovod negotiates every registered process set in
every cycle of its background loop, so the strategy restarts Horovod with the groups' sets at
each switch to hybrid and without them at each switch back
(:meth:`~tfsyncmodes.switching.strategy.SwitchingStrategy.regroup`), and the
hybrid exchange is rebuilt for the new groups over the optimizer variables its state already
has (the same config builds the same state, in the same order).

The hybrid phase runs the hybrid configuration of the run, speed-proportional local steps
(``--sync_local_steps=auto``, the default) included: the fast groups run more steps than the
slow one, so the ranks' step counts part. While such a phase runs, the policy decides every
``ceil(switch_interval / period)`` cross-group rounds instead of every ``switch_interval``
steps (every rank has run the same rounds, whatever its steps, so the allgather meets there;
sync's step pairs the ranks' latest steps), and a decision to go back to
sync takes effect at the end of the epoch, where every group ends it together (the groups' step
counts then differ no more than their epochs' do; the switch makes the optimizer's step counter
the most any rank ran).

A rank slowed *inside* the train function (slow kernels, an input pipeline read in the step)
makes its peers wait for just as long inside theirs, so host timing cannot tell it from them.
Each rank therefore also takes its own compute from the step: the exchange's
:class:`~tfsyncmodes.exchange.clock.ComputeClock` stamps when its gradients are ready, before any
collective, and a rank's own time per step is its time between steps, plus that stamp less the
step's start, plus what the step costs after the gradients for the rank that waits least
(:func:`~tfsyncmodes.switching.decision.own_step_times`); its steps one by one likewise, each
with its own stamp.
"""
from __future__ import annotations

import time
from typing import List, Optional, Tuple

from absl import logging

from tfsyncmodes.exchange import groups as groups_lib
from tfsyncmodes.exchange import communicators, recipes
from tfsyncmodes.exchange.local_steps import SpeedProportionalAverage
from tfsyncmodes.switching.callback import ModeSwitch, wait_for_step
from tfsyncmodes.switching.decision import Decision, Groups, StragglerDecider, own_step_times, shared_step

STEPS_GATHERED = 32  # each rank's latest stamped computes in a window's allgather (-1: none)


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
        self._compute, self._computed, self._began_wall = 0.0, 0, 0.0
        self._computes: List[float] = []  # this window's stamped computes, one per step
        self._skip = 2  # the first steps trace the train function
        self._rounds_seen = 0  # cross-group rounds at the last decision (hybrid, local_steps=auto)
        self._back_to_sync: Optional[Decision] = None  # decided; takes effect at the epoch's end

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.decider.host_groups = self._host_groups() or ()

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
        self._began_wall = time.time()  # the clock's stamp is wall time

    def on_train_batch_end(self, batch, logs=None):
        wait_for_step(logs)
        self._ended = time.perf_counter()
        stamp = self.exchange.clock.read()
        if self._skip == 0 and stamp >= self._began_wall > 0:
            self._compute += stamp - self._began_wall
            self._computed += 1
            self._computes.append(stamp - self._began_wall)
        super().on_train_batch_end(batch, logs)
        policy = self._speed_proportional()
        if policy is None:
            self._step += 1
            if self._step % self.interval == 0:
                self._decide(batch)
        elif self._back_to_sync is None:
            rounds = int(policy.rounds.numpy())
            if rounds - self._rounds_seen >= max(1, -(-self.interval // policy.period)):
                self._rounds_seen = rounds
                self._decide(batch, policy)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)  # the epoch's logs: the mode it trained in
        decision, self._back_to_sync = self._back_to_sync, None
        if decision is not None:  # every group ends the epoch at the same round
            self.switch_to("sync", f"ratio {decision.ratio:.2f}, at the epoch's end")
            self._step, self._began, self._skip = 0, None, 2
            if logs is not None:
                logs["mode_switches"] = logs.get("mode_switches", 0.0) + 1.0

    def _speed_proportional(self):
        """The hybrid phase's speed-proportional policy while it trains (None otherwise)."""
        if self.mode != "hybrid":
            return None
        found = self.exchange.exchanges["hybrid"].find(SpeedProportionalAverage)
        return found[0] if found and found[0].active else None

    def _decide(self, batch: int, policy: Optional[SpeedProportionalAverage] = None) -> None:
        """One window's decision; `policy`: the speed-proportional hybrid phase's, if it runs."""
        gathered = self._gathered_times()
        if gathered is None:
            return  # a window without timed steps (just after a switch): nothing to judge
        decision = self.decider.observe(*gathered)
        self.decisions.append(decision)
        if self._is_chief() and (decision.switched or logging.get_verbosity() >= logging.DEBUG):
            logging.info("tfsyncmodes: step %d: %s", self.step, decision.line())
        self._scalars(decision)
        if not decision.switched:
            return
        if decision.mode == "sync" and policy is not None:
            self._back_to_sync = decision  # the groups' steps differ until the epoch's end
            return
        self.start_switch_clock()  # the switch's cost includes Horovod's restart
        if decision.mode == "hybrid":
            self._regroup(decision.groups)
        self._switch(decision.mode, f"ratio {decision.ratio:.2f}", batch)

    def _switch(self, mode: str, reason: str, batch: int) -> None:
        """Switches to `mode` after the step `batch` of this epoch (mid-epoch)."""
        self.switch_to(mode, reason)
        self._began, self._skip = None, 2  # the new train function traces first
        policy = self._speed_proportional()
        if policy is not None:  # it plans the rest of this epoch from the steps already run
            policy.begin_epoch((self.params or {}).get("steps"), done=batch + 1)
            self._rounds_seen = 0  # the switch started its round count afresh

    def _gathered_times(self) -> Optional[Tuple[List[float], List[List[float]]]]:
        """Every rank's own time per step over the window and its steps one by one (its mean
        time between steps, each stamped compute and the shared part of the step; none without
        stamps): one allgather of the host timings and the stamped computes. None: some rank
        timed no step."""
        import tensorflow as tf

        mine = tf.constant([self._window_row() + self._latest_computes()], tf.float64)
        gathered = communicators.world_allgather(mine, "tfsync_switch_policy_times").numpy()
        self._reset_window()
        if float(gathered[:, 2].min()) < 1:
            return None
        cycle, in_step = list(gathered[:, 0]), list(gathered[:, 1])
        if float(gathered[:, 3].min()) < 0:
            return own_step_times(cycle, in_step), []
        compute = list(gathered[:, 3])
        # A rank's step, were it to set the pace: its time between steps, its compute, and what
        # the step costs after the gradients for the rank that waits least (own_step_times).
        between = [max(c - s, 0.0) + shared_step(in_step, compute) for c, s in zip(cycle, in_step)]
        steps = [[b + float(v) for v in row[4:] if v >= 0] for b, row in zip(between, gathered)]
        return own_step_times(cycle, in_step, compute), steps

    def _window_row(self) -> List[float]:
        """This rank's window: wall time and time inside the train function per step, steps
        timed, stamped compute per step (-1: none stamped)."""
        timed = max(self._timed, 1)
        compute = self._compute / self._computed if self._computed else -1.0
        return [self._cycle / timed, self._in_step / timed, float(self._timed), compute]

    def _latest_computes(self) -> List[float]:
        """This window's latest :data:`STEPS_GATHERED` stamped computes, padded with -1."""
        latest = self._computes[-STEPS_GATHERED:]
        return latest + [-1.0] * (STEPS_GATHERED - len(latest))

    def _reset_window(self) -> None:
        self._in_step = self._cycle = self._compute = 0.0
        self._timed = self._computed = 0
        self._computes = []

    def _host_groups(self) -> Optional[Groups]:
        """One group per host, when the run spans hosts that are groups of the policy's size
        (a group's every-step exchange then stays inside a host); None otherwise."""
        config, layout, hvd = self.strategy.config, self.strategy.layout, self.strategy.hvd
        if config.groups or config.group_size != "host" or layout is None or hvd.local_size() >= hvd.size():
            return None
        if layout.num_groups < 2 or layout.group_size != self.decider.group_size:
            return None
        return layout.groups

    def _regroup(self, groups: Groups) -> None:
        """Rebuilds the hybrid exchange for `groups` over its existing state variables."""
        layout = groups_lib.GroupLayout(tuple(tuple(g) for g in groups))
        active = self.strategy.regroup(layout)
        if active is None:
            return
        hybrid = recipes.mode_exchange(recipes.mode_config(self.strategy.config, "hybrid", decides_at_rounds=True), active)
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
        # Not flushed here: a flush per window would slow the chief's steps (and, in hybrid, its
        # group's pace); the writer flushes at each switch and when training ends.
