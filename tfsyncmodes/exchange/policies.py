"""Cross-group policies: how hybrid groups, each averaging densely inside, keep in step with
each other (``--sync_cross_group``).

Contract: a :class:`CrossGroupPolicy` is an exchange :class:`~tfsyncmodes.exchange.base.Part`
built from the run's config and a :class:`~tfsyncmodes.exchange.link.CrossGroupLink`
(memory, compressor, transport). It acts in the gradient stage (``transform``, before the
inner optimizer's update) or in the model-averaging stage (``after_update``, after it), and
model-averaging policies apply the groups' mean change through :meth:`outer_update`, the hook
an outer optimizer overrides. Every policy ends training with one model (:meth:`finish`).
A policy's state (anchors, counters) is created with the ``state`` factory, so it is optimizer
state. With a single group a policy builds its state and does nothing else.

A new policy: a subclass here (or in its own module) with ``@CROSS_GROUP.register("name")``;
one that acts every ``period`` updates subclasses :class:`RoundPolicy` and writes its
:meth:`RoundPolicy.round` (periodic and elastic do).
"""
from __future__ import annotations

import tensorflow as tf

from tfsyncmodes.exchange.base import Part
from tfsyncmodes.exchange.flat import TensorContext, assign_flat, flatten, flatten_variables, unflatten
from tfsyncmodes.exchange.link import CrossGroupLink
from tfsyncmodes.registry import CROSS_GROUP, OUTER_OPTIMIZERS


class CrossGroupPolicy(Part):
    """Base: builds the link over the flat model and ends training with the groups' mean."""

    background = False  # whether its rounds may run on a thread, up to `staleness` steps late

    def __init__(self, config, link: CrossGroupLink):
        self.config = config
        self.link = link
        self.ctx = None

    @property
    def num_groups(self) -> int:
        return self.link.num_groups

    def build(self, variables, state):
        self.ctx = TensorContext.of_variables(variables)
        self.link.build(self.ctx, state)

    def flush(self):
        self.link.transport.flush()

    def begin_epoch(self, steps) -> None:
        """Keras calls this at each epoch's start with its number of steps (None: unknown)."""
        del steps

    def ends_epoch(self) -> bool:
        """After a step: whether this group must end the epoch here (before its last step),
        because the groups agreed that the epoch ends at this round."""
        return False

    def epoch_logs(self) -> dict:
        """Values for the epoch's logs (and History), read at the epoch's end."""
        return {}

    def finish(self, variables) -> None:
        """The end of training, on every rank after flush(): every rank takes the mean of the
        groups' models, so that training ends with one model. One dense allreduce of the
        weights over all ranks (groups are equally sized and a group's ranks hold equal
        weights, so that is the mean over groups); it is also the final barrier, so that no
        rank leaves (and so shuts Horovod down) while another column still exchanges."""
        if not self.link.active:
            return
        import horovod.tensorflow as hvd

        means = hvd.grouped_allreduce([tf.convert_to_tensor(v) for v in variables], op=hvd.Average,
                                      process_set=hvd.global_process_set, name="tfsync.hybrid.finish")
        for variable, mean in zip(variables, means):
            variable.assign(mean)


@CROSS_GROUP.register("stale")
class StaleExchange(CrossGroupPolicy):
    """Every step: compensate with the residual, compress, send across groups, and return
    ``(own group mean + other groups' updates) / groups``. With a background transport the
    other groups' updates arrive up to `staleness` steps late; this group's own mean enters
    dense and fresh. With compression none and staleness 0 that is sync mode's update."""

    background = True

    def transform(self, grads, variables):
        if not self.link.active:
            return grads
        flat = flatten(grads, variables)
        others = self.link.exchange(self.link.send(flat))
        mean = (flat + others) / float(self.num_groups)
        return [None if g is None else u for g, u in zip(grads, unflatten(mean, variables))]


class RoundPolicy(CrossGroupPolicy):
    """Base of the policies that act in rounds after the inner update: every `period`-th update
    (the knob ``period``; every update during the first `warmup_steps`) :meth:`round` runs,
    otherwise the link idles. A round policy keeps a reference copy of the model (periodic's
    anchor, elastic's center), set to the model before the first update (after the initial
    broadcast), and an update counter, both optimizer state named by the subclass."""

    reference_name = step_name = ""  # the state variables' names (checkpoints know them by it)

    def __init__(self, config, link):
        super().__init__(config, link)
        self.period = config.period
        self.warmup_steps = config.warmup_steps
        self.reference = self.step = None

    def build(self, variables, state):
        super().build(variables, state)
        self.reference = state(self.reference_name, [self.ctx.size], tf.float32)
        self.step = state(self.step_name, [], tf.int64)

    def before_update(self, variables):
        if not self.link.active:
            return

        def start():
            self.reference.assign(flatten_variables(variables))
            return tf.constant(True)

        tf.cond(tf.equal(tf.convert_to_tensor(self.step), 0), start, lambda: tf.constant(False))

    def after_update(self, variables):
        if not self.link.active:
            return
        step = self.step.assign_add(1)
        due = tf.logical_or(step % self.period == 0, step <= self.warmup_steps)

        def run():
            self.round(variables)
            return tf.constant(True)

        def skip():
            self.link.idle()
            return tf.constant(False)

        tf.cond(due, run, skip)

    def round(self, variables) -> None:
        """One round across groups (in the graph, on every rank at the same update)."""
        raise NotImplementedError


@CROSS_GROUP.register("periodic")
class PeriodicAverage(RoundPolicy):
    """Local SGD across groups: each group applies its own group mean; after every `period`-th
    update (the knob ``period``; every update during the first `warmup_steps`) the groups
    average how far their models moved since the last average (the *pseudo-gradient*), sent
    through the compressor with error feedback, and :meth:`outer_update` applies that mean
    change to the anchor with the ``--sync_outer_optimizer``. Groups are at most period - 1 updates
    apart between averages. ``--sync_local_steps=auto``
    builds :class:`~tfsyncmodes.exchange.local_steps.SpeedProportionalAverage` instead."""

    reference_name, step_name = "local_sgd_anchor", "local_sgd_step"

    def __new__(cls, config, link):
        if cls is PeriodicAverage and getattr(config, "local_steps", 0) == "auto":
            from tfsyncmodes.exchange.local_steps import SpeedProportionalAverage

            cls = SpeedProportionalAverage
        return super().__new__(cls)

    def __init__(self, config, link):
        super().__init__(config, link)
        self.outer = OUTER_OPTIMIZERS.get(config.outer_optimizer)(config)

    @property
    def anchor(self):
        """The model after the last average (every rank's, before the first update)."""
        return self.reference

    def build(self, variables, state):
        super().build(variables, state)
        self.outer.build(self.ctx, state)

    def round(self, variables):
        change = flatten_variables(variables) - tf.convert_to_tensor(self.anchor)
        payload = self.link.send(change)
        mean_change = (self.link.sent(payload) + self.link.exchange(payload)) / float(self.num_groups)
        self.outer_update(variables, mean_change)

    def outer_update(self, variables, mean_change: tf.Tensor) -> None:
        """Applies the groups' mean change since the last average with the outer optimizer
        (plain averaging: every rank moves to ``anchor + mean_change``); the result is the
        next anchor."""
        averaged = self.outer.step(tf.convert_to_tensor(self.anchor), mean_change)
        assign_flat(variables, averaged)
        self.anchor.assign(averaged)
