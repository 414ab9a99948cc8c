"""Speed-proportional local steps (``--sync_local_steps=auto``): each group runs as many inner steps
per round as its speed allows.

Dynamic local updates (DyLU) from Async Local-SGD (Liu et al., 2024, "Asynchronous Local-SGD
Training for Language Modeling", arXiv 2401.09135): a worker's number of local steps is
proportional to its measured speed, ``H_g = H * v_g / max_i v_i``, so that every worker
finishes its round at about the same time and the fast ones do not wait for the slow ones.
The paper applies each worker's pseudo-gradient as soon as it arrives; under Horovod every
group must reach each round's collective together, so here the rounds stay synchronous and
the *plan* adapts: at each round every rank allgathers (group, step time, steps since the last
round, steps left in the epoch), and every rank derives the same next plan from those numbers
(the collectives of the next round match on every rank by construction).

- The fastest group runs ``H = period`` inner steps per round, group g its share
  ``H * t_fastest / t_g`` in whole steps (at least 1): floored as in the paper, or rounded up
  where that trains more samples a second (:func:`plan_steps`). A share rounded up makes every
  other group wait for that group at the round; one rounded down costs that group less than
  one of its own steps. So the round's length is chosen among the fastest group's H steps and
  each group's share rounded up, every group running the steps that fit in it, as the one of
  most steps a second (ties: the fastest group's full round, then the groups in order). Equal
  groups a little apart in their timing still run H each; a share of 2.45 steps runs 2 at
  H = 8, where rounding to the nearest (before 0.2.0) ran 3 and made the fast groups wait
  0.55 of a slow step every round. ``t_g`` is an
  exponential moving average (the newest step weighs ``1 - 0.7 ** (H / h_g)`` in a group planned
  ``h_g`` steps a round, so every group's average spans about the same rounds) of the wall
  time between a group's consecutive updates (the
  slowest rank of the group), measured in the step with ``tf.timestamp`` and excluding the
  wait at the round itself.
- The outer average weights each group's pseudo-gradient by the samples it processed since
  the last round (its inner steps; per-rank batches are equal): each group sends
  ``w_g * (model - anchor)`` with ``w_g = steps_g / sum(steps)`` through the compressor and
  error feedback, and the weighted sum is the mean change the outer optimizer applies.
- Groups stay within one round of each other (every round is a collective). An epoch ends at
  the round where the first group has run all of its steps; the other groups end that epoch
  there too (:meth:`ends_epoch`, acted on by the ``DrainExchange`` callback), so that every
  group reaches the epoch's end, and the end of training, after the same rounds. A fast
  group therefore processes more samples per epoch than a slow one. Without a known number
  of steps per epoch every group runs ``H`` steps per round (the fixed schedule).

State: the plan, the steps since the last round, the round count and each group's total
inner steps are optimizer state (``state`` factory); the step-time measurements and the
record of the last rounds (:attr:`round_log`, and the figures each round's plan was made
from, :meth:`recorded_plan_inputs`; for logs and tests) belong to this process.

The round itself is periodic averaging's (:class:`~tfsyncmodes.exchange.policies.RoundPolicy`
runs both): this policy decides when a round is due (:meth:`SpeedProportionalAverage.due`,
which also measures the step), how the groups' changes are weighed
(:meth:`SpeedProportionalAverage.mean_change`), and marks where a step ends
(:meth:`SpeedProportionalAverage.updated`).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from tfsyncmodes.exchange import communicators
from tfsyncmodes.exchange.link import CrossGroupLink
from tfsyncmodes.exchange.policies import PeriodicAverage

ROUND_LOG = 4096  # rounds whose step counts round_log keeps (a ring)
NEWEST = 0.3  # weight of the newest step time in the moving average (a group at period steps a round)


def plan_steps(step_time: tf.Tensor, period: int) -> tf.Tensor:
    """[groups] int64: each group's inner steps for a round, from its step time (all > 0). The
    candidate round lengths are the fastest group's `period` steps and, for each group, its
    share ``period * t_fastest / t_g`` rounded up, times its step; for each, every group runs
    the whole steps that fit (1 to `period`); the plan is the candidate of most steps over its
    longest group (the first of equal ones: the fastest group's full round first)."""
    h = tf.constant(float(period), tf.float64)
    times = tf.maximum(tf.cast(step_time, tf.float64), 1e-12)
    fastest = tf.reduce_min(times)
    share = h * fastest / times
    lengths = tf.concat([[h * fastest], tf.math.ceil(share - 1e-9) * times], axis=0)  # [groups + 1]
    steps = tf.clip_by_value(tf.floor(lengths[:, None] / times[None, :] + 1e-6), 1.0, h)
    per_second = tf.reduce_sum(steps, axis=1) / tf.reduce_max(steps * times[None, :], axis=1)
    candidates = tf.range(tf.shape(lengths)[0])
    best = tf.reduce_min(tf.where(per_second * (1.0 + 1e-9) >= tf.reduce_max(per_second), candidates,
                                  tf.shape(lengths)[0]))
    return tf.cast(tf.gather(steps, best), tf.int64)


class SpeedProportionalAverage(PeriodicAverage):
    """Periodic averaging with speed-proportional local steps: the fastest group runs `period`
    inner steps per round, the others fewer in proportion to their speed, and the groups'
    changes weigh as the samples behind them. `warmup_steps` and `outer` as
    :class:`~tfsyncmodes.exchange.policies.PeriodicAverage`'s."""

    def __init__(self, link: CrossGroupLink, period: int = 8, warmup_steps: int = 0, outer=None):
        super().__init__(link, period, warmup_steps, outer)
        self.plan = self.since = self.rounds = self.totals = None
        self.round_log = self.round_inputs = None
        self._step_time = self._last_end = self._epoch_steps = self._epoch_step = self._epoch_over = None
        self._pending_steps = self._pending_done = -1
        self._epoch_start = None

    @property
    def h_max(self) -> int:
        """The fastest group's inner steps per round."""
        return self.period

    def build(self, variables, state):
        super().build(variables, state)
        groups = self.num_groups
        # Per-group state has a slot per rank, the most groups any regrouping can make (the
        # straggler policy rebuilds this policy over the same state for other groups).
        slots = max(groups, communicators.horovod_world()[1])
        self.plan = state("local_steps_plan", [slots], tf.int64)  # 0: not planned yet
        self.since = state("local_steps_since", [], tf.int64)
        self.rounds = state("local_steps_rounds", [], tf.int64)
        self.totals = state("local_steps_totals", [slots], tf.int64)
        with tf.init_scope():
            def var(value, dtype, name):
                return tf.Variable(value, dtype=dtype, trainable=False, name=name)

            self._step_time = var(0.0, tf.float64, "local_steps_step_time")
            self._last_end = var(0.0, tf.float64, "local_steps_last_end")
            self._epoch_steps = var(self._pending_steps, tf.int64, "local_steps_epoch_steps")
            self._epoch_step = var(max(self._pending_done, 0), tf.int64, "local_steps_epoch_step")
            self._epoch_over = var(False, tf.bool, "local_steps_epoch_over")
            self.round_log = var(tf.zeros([ROUND_LOG, groups], tf.int64), tf.int64, "local_steps_round_log")
            # Per round, what its plan was made from: each group's step time, each group's
            # steps left in the epoch, and the epoch's steps.
            self.round_inputs = var(tf.zeros([ROUND_LOG, 2 * groups + 1], tf.float64), tf.float64,
                                    "local_steps_round_inputs")

    # --- in the step -------------------------------------------------------------------------

    def at_round_boundary(self) -> bool:
        """Between rounds: no group has run a step since the last one (``due`` counts steps,
        so it is not asked here)."""
        return self.since is None or int(self.since.numpy()) == 0

    def _planned(self) -> tf.Tensor:
        """This group's inner steps for the round under way."""
        h_max = tf.constant(self.h_max, tf.int64)
        own = tf.gather(tf.convert_to_tensor(self.plan), self.link.own_group)
        epoch = tf.convert_to_tensor(self._epoch_steps)
        first = tf.where(epoch > 0, tf.minimum(h_max, epoch), h_max)
        return tf.where(own > 0, own, first)

    def due(self, step):
        """Measures the step (its time since the last update ended, a moving average) and
        counts it; a round is due once this group has run its planned inner steps."""
        with tf.control_dependencies([step]):
            now = tf.timestamp()
        last = self._last_end.read_value()
        old = self._step_time.read_value()
        # A group that runs fewer steps a round weighs each more, so that every group's average
        # spans about the same rounds (a slow group that turns fast is seen as soon as a fast one).
        keep = tf.pow(tf.constant(1.0 - NEWEST, tf.float64),
                      float(self.h_max) / tf.cast(tf.maximum(self._planned(), 1), tf.float64))
        newest = tf.where(old > 0, keep * old + (1.0 - keep) * (now - last), now - last)
        self._step_time.assign(tf.where(last > 0, newest, old))
        since = self.since.assign_add(1)
        self._epoch_step.assign_add(1)
        return since >= self._planned()

    def mean_change(self, change):
        """Every rank allgathers (group, step time, steps since the last round, steps left in
        the epoch); each group sends its change weighted by its share of the round's steps,
        and the weighted sum is the mean change. Then the next round's plan."""
        groups, f64 = self.num_groups, tf.float64
        own = self.link.own_group
        since, in_epoch = tf.convert_to_tensor(self.since), tf.convert_to_tensor(self._epoch_step)
        epoch = tf.convert_to_tensor(self._epoch_steps)
        left = tf.where(epoch > 0, epoch - in_epoch, tf.constant(-1, tf.int64))
        info = tf.stack([tf.constant(float(own), f64), tf.convert_to_tensor(self._step_time),
                         tf.cast(since, f64), tf.cast(left, f64), tf.cast(epoch, f64)])
        every = communicators.world_allgather(info[None], "tfsync.local_steps.info")
        group = tf.cast(every[:, 0], tf.int32)
        step_time = tf.math.unsorted_segment_max(every[:, 1], group, groups)  # a group's slowest rank
        steps = tf.cast(tf.math.unsorted_segment_max(every[:, 2], group, groups), tf.int64)
        left = tf.cast(tf.math.unsorted_segment_min(every[:, 3], group, groups), tf.int64)
        epoch = tf.cast(tf.reduce_min(every[:, 4]), tf.int64)

        # The outer average, each group weighted by the samples it processed since the last one.
        weights = tf.cast(steps, tf.float32) / tf.cast(tf.reduce_sum(steps), tf.float32)
        payload = self.link.send(weights[own] * change)
        mean_change = self.link.sent(payload) + self.link.exchange(payload)

        # The next round's plan: proportional to speed, clipped to the steps each group has left.
        h_max = tf.constant(self.h_max, tf.int64)
        fastest = tf.reduce_min(step_time)
        speed = tf.where(fastest > 0, plan_steps(step_time, self.h_max), tf.fill([groups], h_max))
        known = tf.reduce_all(left >= 0)
        over = tf.logical_and(known, tf.reduce_any(left <= 0))
        bound = tf.where(over, tf.fill([groups], epoch), left)
        plan = tf.where(known, tf.minimum(speed, tf.maximum(bound, 1)), tf.fill([groups], h_max))
        count = self.rounds.assign_add(1)
        inputs = tf.concat([step_time, tf.cast(left, f64), tf.cast(epoch, f64)[None]], axis=0)
        planned = tf.group(
            self.totals.assign_add(self._padded(steps)), self.round_log[(count - 1) % ROUND_LOG].assign(steps),
            self.round_inputs[(count - 1) % ROUND_LOG].assign(inputs),
            self.plan.assign(self._padded(plan)), self.since.assign(0), self._epoch_over.assign(over))
        with tf.control_dependencies([planned]):
            return tf.identity(mean_change)

    def _padded(self, per_group: tf.Tensor) -> tf.Tensor:
        """[groups] -> the state's [slots] (zeros after the groups)."""
        slots = int(self.plan.shape[0])
        return tf.pad(per_group, [[0, slots - self.num_groups]])

    def updated(self, rounded):
        """The step's end, once the update and the round (if any) are done: the next step's
        time is measured from here, so the wait at the round is no step's."""
        with tf.control_dependencies([rounded]):
            self._last_end.assign(tf.timestamp())

    # --- around the epochs (the DrainExchange callback) --------------------------------------

    def begin_epoch(self, steps: Optional[int], done: int = 0) -> None:
        """An epoch of `steps` steps begins, of which this rank has run `done` already (a
        switch into hybrid mid-epoch: the plans count the steps each group has left)."""
        self._pending_steps = int(steps) if steps else -1
        self._pending_done = int(done)
        if self._epoch_steps is None:  # not built yet: build() takes the pending values
            return
        self._epoch_steps.assign(self._pending_steps)
        self._epoch_step.assign(self._pending_done)
        self._epoch_over.assign(False)
        self._last_end.assign(0.0)  # the time between epochs is no step's
        self._epoch_start = (self.totals.numpy()[:self.num_groups].copy(), int(self.rounds.numpy()))

    def ends_epoch(self) -> bool:
        if self._epoch_over is None or not self.active or not bool(self._epoch_over.numpy()):
            return False
        self._epoch_over.assign(False)
        return True

    def epoch_logs(self) -> dict:
        """``local_steps_group<g>``: the mean inner steps group g ran per round this epoch;
        ``local_steps_rounds``: the rounds of the epoch."""
        if self.totals is None or not self.active:
            return {}
        totals, rounds = self.totals.numpy()[:self.num_groups], int(self.rounds.numpy())
        start_totals, start_rounds = self._epoch_start or (np.zeros_like(totals), 0)
        done = rounds - start_rounds
        logs = {"local_steps_rounds": float(done)}
        for g in range(self.num_groups):
            logs[f"local_steps_group{g}"] = float(totals[g] - start_totals[g]) / done if done else 0.0
        return logs

    def recorded_rounds(self) -> np.ndarray:
        """[rounds, groups]: the inner steps each group ran in each round so far (at most the
        last ROUND_LOG rounds)."""
        return self._in_order(self.round_log.numpy())

    def recorded_plan_inputs(self):
        """What each round's plan (the next round's steps) was made from, for the rounds of
        :meth:`recorded_rounds`: ([rounds, groups] each group's step time in seconds, [rounds,
        groups] each group's steps left in the epoch (-1: unknown), [rounds] the epoch's
        steps)."""
        inputs = self._in_order(self.round_inputs.numpy())
        groups = self.num_groups
        return (inputs[:, :groups], inputs[:, groups:2 * groups].astype(np.int64),
                inputs[:, 2 * groups].astype(np.int64))

    def _in_order(self, log: np.ndarray) -> np.ndarray:
        rounds = int(self.rounds.numpy())
        if rounds <= ROUND_LOG:
            return log[:rounds]
        start = rounds % ROUND_LOG
        return np.concatenate([log[start:], log[:start]])
