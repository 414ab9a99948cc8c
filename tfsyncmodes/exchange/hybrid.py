"""Hybrid mode's exchange: dense averaging inside a group, compressed updates with error
feedback across groups, and a bound on how far a group may run ahead.

    hybrid_exchange(config) = chain(
        HorovodAllreduce(group process set),          # dense group mean, every step
        CrossGroupExchange(compressor, memory,        # flatten -> + residual -> compress
                           transport))                #  -> send -> mean over groups

The transport decides the bounded asynchrony (``--cross_group``):

* ``stale``: :class:`BackgroundExchange` runs the cross-group exchange on a thread; step t
  hands its payload over and applies the other groups' updates of every round that is done,
  waiting only if round t - staleness is not. A group is therefore never more than
  `staleness` steps ahead of the slowest one. Each group applies
  ``(own dense group mean + other groups' compressed updates) / groups``.
* ``periodic``: :class:`PeriodicAverage` (local SGD) lets groups train on their own group
  means and, every staleness + 1 steps, averages their model changes since the last average.

At the end of training every rank moves to the mean of the groups' models, so a run ends
with one model (:meth:`CrossGroupExchange.finish`).

The first ``warmup_steps`` steps are lockstep in both. ``staleness = 0`` runs the exchange
inside the training step (:class:`InStep`): groups stay in lockstep, and with
``compression=none`` the update equals sync mode's.
"""
from __future__ import annotations

import atexit
import logging
import threading
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfsyncmodes.exchange import compressors as compressors_lib
from tfsyncmodes.exchange import memory as memory_lib
from tfsyncmodes.exchange.base import GradientTransform, chain, densify
from tfsyncmodes.exchange.communicators import (CrossGroupAllgather, CrossGroupAllreduce,
                                                HorovodAllreduce)
from tfsyncmodes.exchange.compressors import payload_bytes

log = logging.getLogger(__name__)


def _num_elements(variable) -> int:
    return int(np.prod(tuple(variable.shape), dtype=np.int64))


def _flat_size(variables: Sequence) -> int:
    return sum(_num_elements(v) for v in variables)


def flatten(tensors: Sequence[Optional[tf.Tensor]], variables: Sequence) -> tf.Tensor:
    """One float32 vector of every tensor (``None``: zeros of its variable's shape)."""
    parts = []
    for tensor, variable in zip(tensors, variables):
        if tensor is None:
            parts.append(tf.zeros([_num_elements(variable)], tf.float32))
        else:
            parts.append(tf.reshape(tf.cast(densify(tensor), tf.float32), [-1]))
    return tf.concat(parts, axis=0)


def unflatten(flat: tf.Tensor, variables: Sequence) -> List[tf.Tensor]:
    sizes = [_num_elements(v) for v in variables]
    return [tf.cast(tf.reshape(part, tuple(v.shape)), v.dtype)
            for part, v in zip(tf.split(flat, sizes), variables)]


class WireTraffic:
    """Bytes this rank put on the cross-group wire, counted from the payloads it sent.

    ``dense_bytes`` is what a float32 exchange of the same update sends every step (sync
    mode's cost), the denominator of the compression ratio.
    """

    def __init__(self):
        self.last_step = None
        self.total = None
        self.steps = None
        self.dense_bytes = 0

    def build(self, size: int) -> None:
        self.dense_bytes = 4 * size
        with tf.init_scope():
            self.last_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="bytes_sent")
            self.total = tf.Variable(0, dtype=tf.int64, trainable=False, name="bytes_sent_total")
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="exchange_steps")

    def record(self, sent_bytes: tf.Tensor):
        return tf.group(self.last_step.assign(sent_bytes), self.total.assign_add(sent_bytes),
                        self.steps.assign_add(1))


class InStep:
    """The exchange runs inside the training step: the step waits for every group."""

    def __init__(self, communicator, compressor):
        self.communicator = communicator
        self.compressor = compressor
        self.size = 0

    def build(self, size: int) -> None:
        self.size = size

    def __call__(self, payload):
        return self.communicator.send_receive(payload, self.compressor, self.size, "tfsync.hybrid.cross")

    def flush(self) -> None:
        pass


class BackgroundExchange(InStep):
    """The exchange runs on a thread, and its results are applied as soon as they are in, at
    most `staleness` steps late; the first `warmup_steps` steps exchange inside the step (in
    lockstep).

    Step t puts its payload (round t) in an outbox queue. The thread takes payloads in order,
    exchanges them across groups (every rank of a column does the same rounds in the same
    order; a round is done when every group has handed it over) and puts the other groups'
    part in an inbox. Step t then applies every round that is in, and waits only if round
    t - staleness is not: a group is never more than `staleness` steps ahead of the slowest
    one, and never waits for it while it is less far ahead.

    The ranks of a group apply the same number of rounds at the same step (each column has its
    own thread, so one may be a round ahead): they agree on it with a Min over the group, so
    their models stay equal. :attr:`applied` counts the rounds applied so far, and
    ``sent - applied`` is how many steps late the exchange runs.

    With `discount` (``--staleness_aware_lr``, on by default) a round applied l steps after it
    was sent counts 1 / (1 + l), as in staleness-aware asynchronous SGD (Zhang et al., 2016):
    a loose bound lets a fast group run far ahead of a straggler, and the straggler's updates,
    computed on a model that many steps old, then steer it less.

    The warm-up keeps the first, largest and fastest-changing updates fresh, as Deep Gradient
    Compression's warm-up does.
    """

    def __init__(self, communicator, compressor, staleness: int, warmup_steps: int = 0,
                 group_set=None, discount: bool = False):
        super().__init__(communicator, compressor)
        self.staleness = staleness
        self.warmup_steps = warmup_steps
        self.group_set = group_set
        self.discount = discount
        self.applied = None
        self._served = 0
        self._sent = None
        self._error = None
        self._done = threading.Condition()
        self._thread = None

    def build(self, size):
        super().build(size)
        specs = self.compressor.payload_spec(size)
        with tf.init_scope():
            # At most `staleness` rounds wait to be exchanged (the step waits beyond that).
            self._outbox = tf.queue.FIFOQueue(self.staleness + 1, [d for d, _ in specs],
                                              shapes=[s for _, s in specs], name="hybrid_outbox")
            self._inbox = tf.queue.FIFOQueue(2 ** 31 - 1, [tf.float32], shapes=[[size]],
                                             name="hybrid_inbox")
            self._sent = tf.Variable(0, dtype=tf.int64, trainable=False, name="hybrid_rounds_sent")
            self.applied = tf.Variable(0, dtype=tf.int64, trainable=False, name="hybrid_rounds_applied")
            self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="hybrid_steps")
        self._thread = threading.Thread(target=self._serve, name="tfsync-hybrid-exchange", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def lag(self) -> int:
        """Rounds handed over but not applied yet: how many steps late the exchange runs."""
        return int(self._sent.numpy() - self.applied.numpy()) if self._sent is not None else 0

    def _agreed(self, available):
        """The number of rounds every rank of this group has in (a Min over the group)."""
        if self.group_set is None:
            return available
        import horovod.tensorflow as hvd

        return hvd.allreduce(available, op=hvd.Min, process_set=self.group_set,
                             name="tfsync.hybrid.rounds_in")

    def __call__(self, payload):
        def in_step():
            return InStep.__call__(self, payload)

        def background():
            put = self._outbox.enqueue(list(payload))
            with tf.control_dependencies([put]):
                sent = self._sent.assign_add(1)
            first = self.applied.read_value()  # the first round this step takes
            required = sent - self.staleness - first
            ready = self._agreed(tf.cast(self._inbox.size(), tf.int64))
            count = tf.maximum(ready, required)
            rounds = self._inbox.dequeue_many(tf.cast(count, tf.int32))
            if self.discount:
                late = sent - 1 - (first + tf.range(count, dtype=tf.int64))  # steps late
                others = tf.tensordot(1.0 / (1.0 + tf.cast(late, tf.float32)), rounds, 1)
            else:
                others = tf.reduce_sum(rounds, axis=0)
            with tf.control_dependencies([self.applied.assign_add(count)]):
                return tf.identity(others)

        if not self.warmup_steps:
            return background()
        others = tf.cond(self._step < self.warmup_steps, in_step, background)
        with tf.control_dependencies([self._step.assign_add(1)]):
            return tf.identity(others)

    def _serve(self):
        while True:
            try:
                payload = self._outbox.dequeue()
            except (tf.errors.OutOfRangeError, tf.errors.CancelledError):
                return
            if not isinstance(payload, (list, tuple)):
                payload = [payload]
            try:
                mean = self.communicator.send_receive(tuple(payload), self.compressor, self.size,
                                                      f"tfsync.hybrid.round{self._served}")
                self._inbox.enqueue([mean])
            except Exception as error:  # a failed peer or a shut-down Horovod: fail the step
                self._error = error
                log.error("hybrid cross-group exchange failed in round %d: %s", self._served, error)
                self._inbox.close(cancel_pending_enqueues=True)
                with self._done:
                    self._done.notify_all()
                return
            with self._done:
                self._served += 1
                self._done.notify_all()

    def flush(self, timeout: Optional[float] = None) -> None:
        """Waits until every payload handed over so far has been exchanged (so this rank
        has done its part in every round its peers need)."""
        if self._thread is None:
            return
        wanted = int(self._sent.numpy())
        with self._done:
            self._done.wait_for(lambda: self._served >= wanted or self._error is not None, timeout)
        if self._error is not None:
            raise RuntimeError(f"hybrid cross-group exchange failed: {self._error}")

    def close(self) -> None:
        if self._thread is None:
            return
        try:
            self._outbox.close(cancel_pending_enqueues=True)
        except Exception:  # interpreter shutdown: the queue may already be gone
            pass
        self._thread.join(timeout=5)
        self._thread = None


class CrossGroupExchange(GradientTransform):
    """Compensate with the residual, compress, remember what was dropped, send across groups,
    and return ``(own group mean + other groups' updates) / groups`` in the gradients' shapes.

    With compression none and staleness 0 that is the mean over all ranks, sync mode's update.
    """

    def __init__(self, compressor, memory, transport):
        self.compressor = compressor
        self.memory = memory
        self.transport = transport
        self.traffic = WireTraffic()

    def build(self, variables):
        size = _flat_size(variables)
        self.variables = list(variables)
        self.memory.build(size)
        self.traffic.build(size)
        self.transport.build(size)

    @property
    def num_groups(self) -> int:
        return self.transport.communicator.num_groups

    def send(self, flat):
        """The payload of `flat` after error feedback, with memory and counters updated."""
        compensated = self.memory.compensate(flat)
        payload = self.compressor.compress(compensated)
        remembered = self.memory.update(compensated, payload, self.compressor)
        counted = self.traffic.record(payload_bytes(payload))
        with tf.control_dependencies([remembered, counted]):
            return tuple(tf.identity(t) for t in payload)

    def __call__(self, grads, variables):
        # This group's own mean enters dense and fresh; the other groups' arrive compressed
        # (and, with a background exchange, up to `staleness` steps late).
        flat = flatten(grads, variables)
        others = self.transport(self.send(flat))
        mean = (flat + others) / float(self.num_groups)
        return [None if g is None else u for g, u in zip(grads, unflatten(mean, variables))]

    def flush(self):
        self.transport.flush()

    def finish(self) -> None:
        """The end of training, on every rank after flush(): every rank takes the mean of the
        groups' models, so that training ends with one model (the groups' weights differ by
        the updates they have not exchanged yet, or applied late). One dense allreduce of the
        weights over all ranks (groups are equally sized and a group's ranks hold equal
        weights, so that is the mean over groups); it is also the final barrier, so that no
        rank leaves (and so shuts Horovod down) while another column still exchanges."""
        import horovod.tensorflow as hvd

        means = hvd.grouped_allreduce([tf.convert_to_tensor(v) for v in self.variables], op=hvd.Average,
                                      process_set=hvd.global_process_set, name="tfsync.hybrid.finish")
        for variable, mean in zip(self.variables, means):
            variable.assign(mean)


class PeriodicAverage(CrossGroupExchange):
    """Local SGD across groups: gradients pass through (each group applies its own group
    mean); every `period` steps the groups average how far their models moved since the last
    average, sent through the compressor with error feedback, and every rank moves to
    ``anchor + mean change``. Groups are at most period - 1 steps apart between averages.
    During the first `warmup_steps` steps they average every step. The final model average
    (:meth:`CrossGroupExchange.finish`) leaves the anchor as it is: the next average counts
    that move as everyone's."""

    def __init__(self, compressor, memory, transport, period: int, warmup_steps: int = 0):
        super().__init__(compressor, memory, transport)
        self.period = period
        self.warmup_steps = warmup_steps

    def build(self, variables):
        super().build(variables)
        with tf.init_scope():
            self.anchor = tf.Variable(tf.zeros([_flat_size(variables)], tf.float32),
                                      trainable=False, name="local_sgd_anchor")
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="local_sgd_step")

    def __call__(self, grads, variables):
        def average():
            current = flatten([tf.convert_to_tensor(v) for v in variables], variables)
            payload = self.send(current - self.anchor)
            sent = self.compressor.decompress(payload, int(current.shape[0]))
            averaged = self.anchor + (sent + self.transport(payload)) / float(self.num_groups)
            updates = [v.assign(u) for v, u in zip(variables, unflatten(averaged, variables))]
            with tf.control_dependencies(updates + [self.anchor.assign(averaged)]):
                return tf.constant(True)

        def skip():
            with tf.control_dependencies([self.traffic.record(tf.constant(0, tf.int64))]):
                return tf.constant(False)

        def start():
            # The first step's variables, after the initial broadcast: every rank's anchor.
            with tf.control_dependencies([self.anchor.assign(
                    flatten([tf.convert_to_tensor(v) for v in variables], variables))]):
                return tf.constant(True)

        started = tf.cond(tf.equal(self.step, 0), start, lambda: tf.constant(False))
        with tf.control_dependencies([started]):
            step = self.step.assign_add(1)
        due = tf.logical_or(step % self.period == 0, step <= self.warmup_steps)
        with tf.control_dependencies([tf.cond(due, average, skip)]):
            return [None if g is None else tf.identity(densify(g)) for g in grads]


def hybrid_exchange(config=None) -> GradientTransform:
    """The hybrid chain for `config` (default: the run's, see ``tfsyncmodes.config.current``).

    A process not launched by horovodrun has no peers: the exchange is the identity, as in
    sync mode.
    """
    from tfsyncmodes import config as config_lib
    from tfsyncmodes.exchange import groups

    config = config or config_lib.current()
    active = groups.active()
    if active is None:
        from tfsyncmodes.cluster import horovod_env

        env = horovod_env()
        if env is None or env.size <= 1:
            return GradientTransform()
        groups.init_horovod(groups.layout_from_config(config, env.size, env.local_size))
        active = groups.active()
    layout = active.layout
    compressor = compressors_lib.for_config(config)
    column = sorted(layout.column_of(active.rank))
    order = [column.index(rank) for rank in layout.column_of(active.rank)]
    communicator_cls = CrossGroupAllgather if compressor.sparse else CrossGroupAllreduce
    communicator = communicator_cls(active.cross_set, order, active.group_index)
    if config.staleness > 0 and config.cross_group == "stale" and layout.num_groups > 1:
        transport = BackgroundExchange(communicator, compressor, config.staleness, config.warmup_steps,
                                       group_set=active.group_set, discount=config.staleness_aware_lr)
    else:
        transport = InStep(communicator, compressor)
    parts = []
    if active.group_set is not None:
        parts.append(HorovodAllreduce(process_set=active.group_set))
    if layout.num_groups > 1:
        if config.cross_group == "periodic":
            parts.append(PeriodicAverage(compressor, memory_lib.for_config(config), transport,
                                         period=config.staleness + 1, warmup_steps=config.warmup_steps))
        else:
            parts.append(CrossGroupExchange(compressor, memory_lib.for_config(config), transport))
    return chain(*parts)


def exchange_parts(optimizer) -> List[CrossGroupExchange]:
    """The cross-group exchanges inside a wrapped optimizer (Keras 3 or tf_keras)."""
    found = []

    def visit(part):
        if isinstance(part, CrossGroupExchange):
            found.append(part)
        for child in getattr(part, "parts", ()):
            visit(child)

    for attribute in ("_exchange", "_tfsync_exchange"):
        part = getattr(optimizer, attribute, None)
        if part is not None:
            visit(part)
    return found
