"""Cross-group policies: how hybrid groups, each averaging densely inside, keep in step with
each other (``--sync_cross_group``).

Contract: a :class:`CrossGroupPolicy` is an exchange :class:`~tfsyncmodes.exchange.base.Part`
built from a :class:`~tfsyncmodes.exchange.link.CrossGroupLink` (memory, compressor,
transport) and its own settings as keyword arguments (``PeriodicAverage(link, period=8,
outer=NesterovOuter())``), never the run's config. It acts in the gradient stage
(``transform``, before the inner optimizer's update) or in the model-averaging stage
(``after_update``, after it), and model-averaging policies apply the groups' mean change
through :meth:`PeriodicAverage.outer_update`, the hook an outer optimizer overrides. Every
policy ends training with one model (:meth:`finish`). A policy's state (anchors, counters) is
created with the ``state`` factory, so it is optimizer state. With a single group a policy
builds its state and does nothing else.

A new policy: a subclass here (or in its own module) with ``@CROSS_GROUP.register("name")``;
one that acts in rounds after the inner update subclasses :class:`RoundPolicy` and writes its
:meth:`RoundPolicy.round` (periodic and elastic do); one that decides otherwise when a round
is due overrides :meth:`RoundPolicy.due` (speed-proportional local steps do).
"""
from __future__ import annotations

import tensorflow as tf

from tfsyncmodes.exchange import communicators
from tfsyncmodes.exchange.base import Part
from tfsyncmodes.exchange.flat import TensorContext, assign_flat, flatten, flatten_variables, unflatten
from tfsyncmodes.exchange.link import CrossGroupLink
from tfsyncmodes.exchange.outer import AverageOuter
from tfsyncmodes.registry import CROSS_GROUP


class CrossGroupPolicy(Part):
    """Base: builds the link over the flat model and ends training with the groups' mean."""

    background = False  # whether its rounds may run on a thread, up to `staleness` steps late

    def __init__(self, link: CrossGroupLink):
        self.link = link
        self.ctx = None

    @property
    def num_groups(self) -> int:
        return self.link.num_groups

    @property
    def active(self) -> bool:
        """Whether there are other groups to exchange with."""
        return self.link.active

    def build(self, variables, state):
        self.ctx = TensorContext.of_variables(variables)
        self.link.build(self.ctx, state)

    def flush(self):
        self.link.flush()

    def discard_pending(self) -> None:
        """Drops rounds that came in but were not applied (a switch replaces them with the
        groups' mean)."""
        self.link.discard()

    def begin_epoch(self, steps, done: int = 0) -> None:
        """Keras calls this at each epoch's start with its number of steps (None: unknown);
        `done`: the steps of it this rank has run already (the policy starts mid-epoch)."""
        del steps, done

    def ends_epoch(self) -> bool:
        """After a step: whether this group must end the epoch here (before its last step),
        because the groups agreed that the epoch ends at this round."""
        return False

    def epoch_logs(self) -> dict:
        """Values for the epoch's logs (and History), read at the epoch's end."""
        return {}

    def at_round_boundary(self) -> bool:
        """Eagerly, between steps: whether no cross-group round is under way, so that the state
        may be committed here (an elastic job rolls back to its commits). Every step is one
        for an in-step exchange; a background one must have applied every round it started."""
        return self.link.lag() in (None, 0)

    def finish(self, variables) -> None:
        """The end of training, on every rank after flush(): every rank takes the mean of the
        groups' models, so that training ends with one model. One dense allreduce of the
        weights over all ranks (groups are equally sized and a group's ranks hold equal
        weights, so that is the mean over groups); it is also the final barrier, so that no
        rank leaves (and so shuts Horovod down) while another column still exchanges."""
        if not self.active:
            return
        communicators.assign_world_mean(variables, "tfsync.hybrid.finish")


@CROSS_GROUP.register("stale")
class StaleExchange(CrossGroupPolicy):
    """Every step: compensate with the residual, compress, send across groups, and return
    ``(own group mean + other groups' updates) / groups``. With a background transport the
    other groups' updates arrive up to `staleness` steps late; this group's own mean enters
    dense and fresh. With no compression and an in-step transport that is sync mode's update."""

    background = True

    def transform(self, grads, variables):
        if not self.active:
            return grads
        flat = flatten(grads, variables)
        others = self.link.exchange(self.link.send(flat))
        mean = (flat + others) / float(self.num_groups)
        return [None if g is None else u for g, u in zip(grads, unflatten(mean, variables))]


class RoundPolicy(CrossGroupPolicy):
    """Base of the policies that act in rounds after the inner update: after every update
    :meth:`due` says whether a round is due (every `period`-th update; every update during the
    first `warmup_steps` in any case); if so :meth:`round` runs, otherwise the link idles. A
    :meth:`updated` follows either way. A
    round policy keeps a reference copy of the model (periodic's anchor, elastic's center),
    set to the model before the first update (after the initial broadcast), and an update
    counter, both optimizer state named by the subclass.

    `period`: updates per round (>= 1); `warmup_steps`: updates at the start that each end
    with a round.
    """

    reference_name = step_name = ""  # the state variables' names (checkpoints know them by it)

    def __init__(self, link: CrossGroupLink, period: int = 8, warmup_steps: int = 0):
        super().__init__(link)
        if period < 1 or warmup_steps < 0:
            raise ValueError(f"{type(self).__name__}(period={period}, warmup_steps={warmup_steps}): "
                             "use a period of 1 or more and warmup_steps of 0 or more")
        self.period = period
        self.warmup_steps = warmup_steps
        self.reference = self.step = None

    def build(self, variables, state):
        super().build(variables, state)
        self.reference = state(self.reference_name, [self.ctx.size], tf.float32)
        self.step = state(self.step_name, [], tf.int64)

    def before_update(self, variables):
        if not self.active:
            return

        def start():
            self.reference.assign(flatten_variables(variables))
            return tf.constant(True)

        tf.cond(tf.equal(tf.convert_to_tensor(self.step), 0), start, lambda: tf.constant(False))

    def after_update(self, variables):
        if not self.active:
            return
        # The counter (and the clocks of speed-proportional steps) after this update is applied:
        # ops on other variables are not ordered after it by themselves, and a step time read
        # early would leave the step's own compute out.
        applied = [tf.convert_to_tensor(v) for v in variables]
        with tf.control_dependencies(applied):
            step = self.step.assign_add(1)
        due = tf.logical_or(self.due(step), step <= self.warmup_steps)

        def run():
            self.round(variables)
            return tf.constant(True)

        def skip():
            self.link.idle()
            return tf.constant(False)

        rounded = tf.cond(due, run, skip)
        with tf.control_dependencies(applied):
            self.updated(tf.identity(rounded))

    def at_round_boundary(self) -> bool:
        """After a round (or before the first update): the groups hold the model the round gave."""
        step = 0 if self.step is None else int(self.step.numpy())
        return step == 0 or step <= self.warmup_steps or bool(self.due(tf.constant(step, tf.int64)))

    def due(self, step: tf.Tensor) -> tf.Tensor:
        """Whether a round is due after update number `step` (from 1), the warm-up aside: every
        `period`-th update. In the graph, once per update."""
        return step % self.period == 0

    def updated(self, rounded: tf.Tensor) -> None:
        """After every update, once its round (if one was due) is done; `rounded` says whether
        one was. In the graph; nothing by default."""
        del rounded

    def round(self, variables) -> None:
        """One round across groups (in the graph, on every rank at the same update)."""
        raise NotImplementedError


@CROSS_GROUP.register("periodic")
class PeriodicAverage(RoundPolicy):
    """Local SGD across groups: each group applies its own group mean; after every `period`-th
    update (every update during the first `warmup_steps`) the groups average how far their
    models moved since the last average (the *pseudo-gradient*), sent through the link's
    compressor with error feedback, and :meth:`outer_update` applies that mean change to the
    anchor with the outer optimizer `outer` (:class:`~tfsyncmodes.exchange.outer.AverageOuter`
    by default: plain averaging). Groups are at most period - 1 updates apart between averages.
    :class:`~tfsyncmodes.exchange.local_steps.SpeedProportionalAverage` gives each group as
    many inner steps per round as its speed allows."""

    reference_name, step_name = "local_sgd_anchor", "local_sgd_step"

    def __init__(self, link: CrossGroupLink, period: int = 8, warmup_steps: int = 0, outer=None):
        super().__init__(link, period, warmup_steps)
        self.outer = outer if outer is not None else AverageOuter()

    @property
    def anchor(self):
        """The model after the last average (every rank's, before the first update)."""
        return self.reference

    def build(self, variables, state):
        super().build(variables, state)
        self.outer.build(self.ctx, state)

    def round(self, variables):
        change = flatten_variables(variables) - tf.convert_to_tensor(self.anchor)
        self.outer_update(variables, self.mean_change(change))

    def mean_change(self, change: tf.Tensor) -> tf.Tensor:
        """The groups' mean of their `change` (sent through the link): every group weighs the same."""
        payload = self.link.send(change)
        return (self.link.sent(payload) + self.link.exchange(payload)) / float(self.num_groups)

    def outer_update(self, variables, mean_change: tf.Tensor) -> None:
        """Applies the groups' mean change since the last average with the outer optimizer
        (plain averaging: every rank moves to ``anchor + mean_change``); the result is the
        next anchor."""
        averaged = self.outer.step(tf.convert_to_tensor(self.anchor), mean_change)
        assign_flat(variables, averaged)
        self.anchor.assign(averaged)
