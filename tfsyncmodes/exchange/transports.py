"""Transports: when a cross-group round runs relative to the training step.

Contract: ``build(ctx, state, start)``, ``__call__(payload) -> the other groups' part``,
``flush()``, ``discard()``, ``close()``, ``lag()``, ``rounds_applied()``, and the
communicator's ``num_groups`` and ``own_group``. :class:`InStep` runs the round inside the
step; :class:`BackgroundExchange` runs rounds on a thread and applies them up to `staleness`
steps late, composing an :class:`InStep` for its lock-step warm-up.
"""
from __future__ import annotations

import atexit
import logging
import threading
from typing import Optional

import tensorflow as tf

from tfsyncmodes.exchange import communicators

log = logging.getLogger(__name__)


class InStep:
    """The exchange runs inside the training step: the step waits for every group.
    `communicator` carries `compressor`'s payloads across the groups."""

    background = False  # rounds are applied at the step that sends them

    def __init__(self, communicator, compressor):
        self.communicator = communicator
        self.compressor = compressor
        self.ctx = None

    @property
    def num_groups(self) -> int:
        return self.communicator.num_groups

    @property
    def own_group(self) -> int:
        """This rank's group index."""
        return self.communicator.own

    def build(self, ctx, state, start: bool = True) -> None:
        del state, start
        self.ctx = ctx

    def payload_spec(self):
        """(dtype, shape) of each payload tensor of the built tensor."""
        return self.compressor.payload_spec(self.ctx)

    def wire_bytes(self, payload):
        """Bytes this rank puts on the cross-group wire for `payload` (its communicator's count)."""
        return self.communicator.wire_bytes(tuple(payload))

    def round(self, payload, name: str, ctx=None):
        """One round across groups: the sum of the other groups' updates, dense (`ctx`: a
        fragment's context; None: the whole model's)."""
        return self.communicator.send_receive(tuple(payload), self.compressor, ctx or self.ctx, name)

    def __call__(self, payload):
        return self.round(payload, "tfsync.hybrid.cross")

    def lag(self) -> Optional[int]:
        return None

    def rounds_applied(self) -> Optional[int]:
        """Background rounds applied so far (None: rounds run in the step)."""
        return None

    def flush(self, timeout: Optional[float] = None) -> None:
        pass

    def discard(self) -> None:
        """Nothing is ever pending in the step."""

    def close(self) -> None:
        pass


class BackgroundExchange:
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

    With `discount` (``--sync_staleness_aware_lr``, on by default) a round applied l steps after it
    was sent counts 1 / (1 + l), as in staleness-aware asynchronous SGD (Zhang et al., 2016).
    The warm-up keeps the first, largest and fastest-changing updates fresh, as Deep Gradient
    Compression's warm-up does.

    `in_step`: the transport of the warm-up, whose communicator the thread uses;
    `group_set`: this rank's group's process set (None: a group of one rank).
    """

    background = True

    def __init__(self, in_step: InStep, staleness: int = 1, warmup_steps: int = 0, group_set=None,
                 discount: bool = False):
        if staleness < 1:
            raise ValueError(f"a background exchange with staleness {staleness}: use 1 or more "
                             "(0 is the in-step exchange, InStep)")
        self.in_step = in_step
        self.staleness = staleness
        self.warmup_steps = warmup_steps
        self.group_set = group_set
        self.discount = discount
        self.applied = self._sent = self._step = None
        self._served = 0
        self._error = None
        self._done = threading.Condition()
        self._thread = None

    @property
    def num_groups(self) -> int:
        return self.in_step.num_groups

    @property
    def own_group(self) -> int:
        return self.in_step.own_group

    def wire_bytes(self, payload):
        return self.in_step.wire_bytes(payload)

    def build(self, ctx, state, start: bool = True):
        self.in_step.build(ctx, state)
        self._step = state("hybrid_steps", [], tf.int64)  # a resumed run does not warm up again
        if not start:
            return
        specs = self.in_step.payload_spec()
        with tf.init_scope():
            # Rounds in flight belong to this process's queues, not to the optimizer state: a
            # checkpoint holds the model with every round applied so far.
            self._sent = tf.Variable(0, dtype=tf.int64, trainable=False, name="hybrid_rounds_sent")
            self.applied = tf.Variable(0, dtype=tf.int64, trainable=False, name="hybrid_rounds_applied")
            # At most `staleness` rounds wait to be exchanged (the step waits beyond that).
            self._outbox = tf.queue.FIFOQueue(self.staleness + 1, [d for d, _ in specs],
                                              shapes=[s for _, s in specs], name="hybrid_outbox")
            self._inbox = tf.queue.FIFOQueue(2 ** 31 - 1, [tf.float32], shapes=[[ctx.size]],
                                             name="hybrid_inbox")
        self._thread = threading.Thread(target=self._serve, name="tfsync-hybrid-exchange", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def lag(self) -> Optional[int]:
        """Rounds handed over but not applied yet: how many steps late the exchange runs."""
        return int(self._sent.numpy() - self.applied.numpy()) if self._sent is not None else None

    def rounds_applied(self) -> Optional[int]:
        """Rounds applied so far (None before the thread starts)."""
        return int(self.applied.numpy()) if self.applied is not None else None

    def _agreed(self, available):
        """The number of rounds every rank of this group has in (a Min over the group)."""
        return communicators.group_min(available, self.group_set, "tfsync.hybrid.rounds_in")

    def _background(self, payload):
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

    def __call__(self, payload):
        if not self.warmup_steps:
            return self._background(payload)
        others = tf.cond(self._step < self.warmup_steps, lambda: self.in_step(payload),
                         lambda: self._background(payload))
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
                mean = self.in_step.round(payload, f"tfsync.hybrid.round{self._served}")
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

    def discard(self) -> None:
        """After :meth:`flush`: drops the rounds that came in but were not applied, so that
        the next step starts with none pending (a switch out of hybrid, whose final model
        average replaces them)."""
        if self._thread is None:
            return
        self.flush()
        pending = int(self._sent.numpy() - self.applied.numpy())
        if pending > 0:
            self._inbox.dequeue_many(pending)
        self.applied.assign(self._sent)

    def close(self) -> None:
        if self._thread is None:
            return
        try:
            self._outbox.close(cancel_pending_enqueues=True)
        except Exception:  # interpreter shutdown: the queue may already be gone
            pass
        self._thread.join(timeout=5)
        self._thread = None
