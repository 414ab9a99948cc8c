"""A lost worker's async step is applied once (``--sync_exactly_once``, on by default).

``ClusterCoordinator`` runs a scheduled step at least once: when a worker is lost before it
reports, the step is put back and run again on another worker. If the lost worker's writes had
reached the parameter server, in full or in part, the step would then be applied twice: one
update, one ``optimizer.iterations`` increment and one batch of every metric too many (a chaos
run of 3000 steps ended at 3001 before this).

Two parts make it once:

* **One unit of writes** (:meth:`AppliedSteps.on_ps`). Every value the step's writes take from
  the worker (gradients, targets and predictions, the batch's size, the step's id) is gathered
  on the parameter server by one ``IdentityN`` there, and every write op is placed there and
  runs after it. A worker lost before the server holds them all leaves nothing written; once
  it does, the server needs nothing more from the worker, and finishes the writes and the mark
  on its own unless its call is cancelled first (below; tested: a worker aborted while
  sending, `tests/test_async_exact.py`).
* **A mark per step** (:class:`AppliedSteps`): a ring of ``size`` int64 slots on the server,
  step ``i`` marking slot ``i % size`` with ``i + 1`` after every variable it wrote holds its
  update. Every step carries its id as an argument of the scheduled function, so the
  coordinator's re-run carries the same id; it reads its slot first and, if marked, skips the
  step's writes (under tf_keras the whole step; Keras 3's loop runs the forward and backward
  pass beside the check, so a skipped re-run wastes that compute). The loops wait for every
  step at each epoch's end, so at most ``steps_per_epoch`` steps are in flight and a ring of
  that size never overwrites a step that could still be run again.

What is left: a worker lost while the server makes its unit's writes. The server runs the
unit as part of the worker's call (``RunComponentFunction``), whose handler cancels the call
when the worker's connection drops; that can stop the unit between two of its writes, and the
re-run then applies the step again in full. The window is the unit's own duration (a
millisecond or less here). One chaos run in 87 kills ended with one optimizer step counted
twice and that step's samples once, which fits a unit cut short (BENCHMARKS.md). Closing it needs a
unit of writes the caller's loss cannot cut short (one kernel, or a call the worker does not
own).

The unit needs one parameter server: servers do not send to each other (the strategy's device
filters), so with several the writes stay on their own servers and a worker lost while they
are in flight can still have its step applied twice; so can a model whose own ``train_step``
makes its writes without ``strategy.one_unit``. Both are logged once. A re-run that reaches
the server while the lost worker's unit is still being written (under a millisecond on
loopback, against the coordinator's seconds to notice a lost worker) is not covered.

The check wraps ``strategy.run`` in the worker's function (cross-replica context): the
optimizers' distributed update paths refuse a conditional inside the replica function. What it
costs a step is measured in BENCHMARKS.md ("Async steps applied once").
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, Iterable

import tensorflow as tf
from absl import logging

from tfsyncmodes.exchange.version import tf_variable


def _resources(variable):
    """The tf.Variables behind a Keras 3 or tf_keras variable: a sharded one's shards (one
    per parameter server, ``--sync_ps_shards``), or the one variable."""
    if isinstance(variable, tf.Variable):
        return [variable]
    shards = getattr(variable, "variables", None)  # tf.distribute's ShardedVariable
    if isinstance(shards, (list, tuple)):
        return list(shards)
    return [tf_variable(variable)]


class AtLeastOnce:
    """No check: every run of a step applies it (the default; the coordinator's at least once)."""

    skipped = None

    def next_id(self) -> tf.Tensor:
        return tf.constant(0, tf.int64)

    def run(self, step_id, step, written, inputs=None):
        del step_id, written
        outputs = step(*(tuple(inputs()) if inputs is not None else ()))
        return {**outputs, "applied": tf.constant(1, tf.int64)}

    def on_ps(self, writes: Callable[..., Any], *values):
        """``writes(*values)``, as it is (see :meth:`AppliedSteps.on_ps`)."""
        return writes(*values)


class AppliedSteps:
    """A ring of step ids on the parameter servers; create it inside the strategy's scope."""

    def __init__(self, size: int, servers: int = 1, name: str = "tfsync_applied_steps"):
        if size < 1:
            raise ValueError(f"AppliedSteps needs size >= 1 (the steps in flight), got {size}")
        self.size = size
        self.servers = servers
        self.ring = tf.Variable(tf.zeros([size], tf.int64), trainable=False, name=name)
        # Re-runs that found their step applied (atomic on the parameter servers).
        self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name=name + "_skipped")
        self._ids = itertools.count()
        self._warned = False
        self._tracing = {}  # while a step is traced: its id, and its copy on the server once gated

    def next_id(self) -> tf.Tensor:
        """The id the next scheduled step carries (a scalar, so the function is traced once)."""
        return tf.constant(next(self._ids), tf.int64)

    def on_ps(self, writes: Callable[..., Any], *values):
        """``writes(*values)`` as one unit on the parameter server (in the replica function).

        Every op `writes` makes is placed on the parameter server that holds the ring (ops on a
        variable stay with it), and none starts before every tensor in `values` has arrived
        there: a worker lost before that leaves nothing written, and once it holds them the
        server needs nothing more from the worker to finish the writes and the mark. Pass
        everything the writes need from the worker's computation in `values`; a tensor they
        take from elsewhere is fetched later, outside the unit. With several parameter servers
        (which cannot send to each other) the writes are not gathered on one, and a step's
        writes are not one unit (:attr:`one_unit` is False)."""
        if not self.one_unit:
            return writes(*values)
        flat = tf.nest.flatten(values)
        tensors = [i for i, value in enumerate(flat) if value is not None]
        # The step's id travels with them: the mark, made after the writes, is the unit's too.
        step_id = self._tracing.get("step_id")
        with tf.device(self.ring.device):
            arrived = tf.identity_n([flat[i] for i in tensors] + ([step_id] if step_id is not None else []))
            for i, value in zip(tensors, arrived):
                flat[i] = value
            if step_id is not None:
                self._tracing["gated_id"] = arrived[-1]
            # Writes that take none of the values (a counter's increment) wait for them too.
            with tf.control_dependencies(arrived):
                return writes(*tf.nest.pack_sequence_as(values, flat))

    @property
    def one_unit(self) -> bool:
        """Whether a step's writes land as one unit (one parameter server)."""
        return self.servers == 1

    def _slot(self, step_id):
        return tf.math.floormod(step_id, self.size)

    def landed(self, step_id) -> tf.Tensor:
        """Whether step `step_id`'s update is on the parameter servers already."""
        return tf.equal(tf.gather(self.ring, self._slot(step_id)), step_id + 1)

    def mark(self, step_id, written: Iterable) -> tf.Operation:
        """Marks `step_id` once each variable in `written` has taken this step's writes (a read
        of each, ordered after its writes by the function's automatic control dependencies)."""
        # A read's value is an Identity made where the read is: made in the replica function it
        # would be the worker's, and every written variable (the model and its slots) would be
        # sent to the worker each step only to order the mark. On the ring's server (one ps:
        # every variable's) nothing moves; several servers cannot send to each other, so there
        # the reads stay where they are made.
        with tf.device(self.ring.device if self.one_unit else None):
            reads = [r.read_value().op for v in written for r in _resources(v)]
        with tf.device(self.ring.device), tf.control_dependencies(reads):
            return self.ring.scatter_update(tf.IndexedSlices(
                tf.reshape(step_id + 1, [1]), tf.reshape(self._slot(step_id), [1]))).op

    def run(self, step_id, step: Callable[..., Dict[str, tf.Tensor]],
            written: Callable[[], Iterable], inputs: Callable[[], object] = None) -> Dict[str, tf.Tensor]:
        """``step(*inputs())`` unless `step_id` has landed; then zeros of the same structure. The
        result gains ``applied``: 1 when this run applied the step, 0 when it found it applied.

        `inputs`, when given, computes what the step needs before it writes anything (the
        forward and backward pass): it runs outside the check, so the check's read of the
        parameter servers overlaps it instead of delaying the step. `written` lists the
        variables the step writes (called after ``step``, so variables it creates count)."""
        traced = {}
        computed = tuple(inputs()) if inputs is not None else ()

        def apply():
            self._tracing = {"step_id": step_id}
            outputs = step(*computed)
            # The mark waits for the writes only (not for the outputs, which may read the
            # parameter servers again). Gated with the writes (on_ps), it is made from the id
            # the server holds, so nothing more from the worker is needed to make it.
            if "gated_id" not in self._tracing and not self._warned:
                self._warned = True
                logging.warning(
                    "exactly_once: a step's writes are not one unit (%s): a worker lost while "
                    "they are in flight can still have its step applied twice", "several ps tasks"
                    if not self.one_unit else "the model's own train_step makes them without strategy.one_unit")
            marked = self.mark(self._tracing.pop("gated_id", step_id), written())
            self._tracing = {}
            with tf.control_dependencies([marked]):
                outputs = tf.nest.map_structure(tf.identity, outputs)
            traced["outputs"] = outputs
            return {**outputs, "applied": tf.constant(1, tf.int64)}

        def skip():  # traced after apply (cond traces its true branch first)
            counted = self.skipped.assign_add(1, read_value=False)
            with tf.control_dependencies([counted]):
                zeros = tf.nest.map_structure(lambda t: tf.zeros(t.shape, t.dtype), traced["outputs"])
                return {**zeros, "applied": tf.constant(0, tf.int64)}

        return tf.cond(tf.logical_not(self.landed(step_id)), apply, skip)
