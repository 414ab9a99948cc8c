"""A lost worker's async step is applied once (``--sync_exactly_once``, on by default).

``ClusterCoordinator`` runs a scheduled step at least once: when a worker is lost before it
reports, the step is put back and run again on another worker. If the lost worker's writes had
reached the parameter server, in full or in part, the step would then be applied twice: one
update, one ``optimizer.iterations`` increment and one batch of every metric too many (a chaos
run of 3000 steps ended at 3001 before this).

Two parts make it once:

* **One unit of writes** (:meth:`AppliedSteps.on_ps`). Every value the step's writes take from
  the worker (gradients, targets and predictions, the batch's size, the step's id) is gathered
  on the parameter server by one ``IdentityN`` there, and the writes and the step's mark run
  after it as one call op there (a function that is not inlined), every op of it on the server.
  A worker lost before the server holds the values leaves nothing written (tested: a worker
  aborted while sending, `tests/test_async_exact.py`). Once the call has started it needs
  nothing more from the worker and runs to its end: when the worker dies the server aborts
  what is left of its step, the call included, but TensorFlow acts on that only at a loop's
  next iteration or before a function call starts, never inside a started op, and the unit
  has no loop (its conditionals are lowered to switches and the functions it calls inlined, as
  TensorFlow does by default; tested: a worker aborted while the server works 2.3 s inside the
  unit). A traced unit with a loop (:func:`loops_in`) is logged once.
* **A mark per step** (:class:`AppliedSteps`): a ring of ``size`` int64 slots on the server,
  step ``i`` marking slot ``i % size`` with ``i + 1`` after every variable it wrote holds its
  update. Every step carries its id as an argument of the scheduled function, so the
  coordinator's re-run carries the same id; it reads its slot first and, if marked, skips the
  step's writes (under tf_keras the whole step; Keras 3's loop runs the forward and backward
  pass beside the check, so a skipped re-run wastes that compute). The loops wait for every
  step at each epoch's end, so at most ``steps_per_epoch`` steps are in flight and a ring of
  that size never overwrites a step that could still be run again.

Before (see the CHANGELOG) the writes were made in the worker's replica function under a device
scope, which tf.distribute's merge calls do not keep (tf_keras' ``apply_gradients`` makes its
update in one): a worker lost while the server made them could leave its step applied and not
marked, and the re-run applied it again (one chaos run in 87 kills ended with one optimizer
step counted twice and its samples once; the test above did so in 5 of 8 runs under tf_keras,
and does again with the call op placed on the worker).

The unit needs one parameter server: servers do not send to each other (the strategy's device
filters), so with several the writes stay on their own servers and a worker lost while they
are in flight can still have its step applied twice; so can a model whose own ``train_step``
makes its writes without ``strategy.one_unit``. Both are logged once.

The check wraps ``strategy.run`` in the worker's function (cross-replica context): the
optimizers' distributed update paths refuse a conditional inside the replica function. What it
costs a step is measured in BENCHMARKS.md ("Async steps applied once").
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, Iterable, List

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


LOOPS = ("While", "StatelessWhile")


def loops_in(concrete) -> List[str]:
    """The names of the loops in a traced function, in the functions it calls too (a
    conditional's branches). When a worker is lost, the server aborts what is left of its step
    there; TensorFlow checks for that at each iteration of a loop (and before a function call
    starts, which a unit's inlined calls and lowered conditionals do not make), while an op that
    has started runs to its end: a unit without loops, once started, is not cut."""
    graph_def = concrete.graph.as_graph_def()
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return sorted({n.name for n in nodes if n.op in LOOPS})


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
        self._warned = self._loops_warned = False
        self._tracing = {}  # while a step is traced: its id, what it writes, whether its unit marked it

    def next_id(self) -> tf.Tensor:
        """The id the next scheduled step carries (a scalar, so the function is traced once)."""
        return tf.constant(next(self._ids), tf.int64)

    def on_ps(self, writes: Callable[..., Any], *values):
        """``writes(*values)`` as one unit on the parameter server (in the replica function).

        The writes, and the step's mark after them, run as one call op on the parameter server
        that holds the ring, every op of it there, and it starts once every tensor in `values`
        (and any tensor the writes capture from the worker's computation) has arrived there: a
        worker lost before that leaves nothing written, and once it holds them the server needs
        nothing more from the worker to finish the writes and the mark. The writes are traced
        in the replica context of the call's own graph (the optimizers' merge calls need one).
        With several parameter servers (which cannot send to each other) the writes are not
        gathered on one, and a step's writes are not one unit (:attr:`one_unit` is False)."""
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
        held = tf.nest.pack_sequence_as(values, flat)
        written = self._tracing.get("written")

        def unit(held, gated_id):
            # In the cross-replica context of the call's own graph: the writes enter its replica
            # context (where the optimizers' merge calls work) with values made on the server,
            # which name its device (a reduction's destination).
            with tf.device(self.ring.device):
                held = tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), held)
            outputs = tf.distribute.get_strategy().run(lambda *h: writes(*h), args=tuple(held))
            if gated_id is None:
                return outputs
            marked = self.mark(gated_id, written())  # it reads every variable written
            with tf.control_dependencies([marked]):
                return tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), outputs)

        # One call op on the server, every op of its body there: those a merge call makes too
        # (tf_keras' apply_gradients makes its update in one), which do not keep the caller's
        # device scope. With the call on the worker, a worker lost mid-unit left its step
        # applied and not marked under tf_keras, to be applied again by the re-run (the test).
        # Not inlined, it starts once every argument (captures included) is there.
        call = tf.function(unit, experimental_attributes={"_noinline": True})

        def on_server(strategy, held, gated_id):
            del strategy
            with tf.device(self.ring.device):  # a merge call's ops do not take the caller's device
                outputs = call(held, gated_id)
                self._check_loops(call.get_concrete_function(held, gated_id))  # the trace just made
                return outputs

        # Writes that take none of the values (a counter's increment) wait for them too.
        with tf.control_dependencies(arrived):
            outputs = tf.distribute.get_replica_context().merge_call(
                on_server, args=(held, arrived[-1] if step_id is not None else None))
        if step_id is not None:
            self._tracing["marked"] = True
        return outputs

    def _check_loops(self, unit) -> None:
        """Warns, once, when the traced unit has a loop: where the worker's loss can cut it."""
        if self._loops_warned:
            return
        loops = loops_in(unit)
        if loops:
            self._loops_warned = True
            logging.warning(
                "exactly_once: the step's unit of writes has a loop (%s): when a worker is lost, the "
                "server stops what is left of its step at a loop's next iteration, so a worker lost "
                "while its unit runs can have its step applied twice", ", ".join(loops[:3]))

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
            self._tracing = {"step_id": step_id, "written": written}
            outputs = step(*computed)
            marked_in_unit = self._tracing.get("marked", False)
            self._tracing = {}
            if not marked_in_unit:
                # Writes not made through on_ps (several ps, or a model's own train_step
                # without strategy.one_unit): the mark waits for them only, not for the
                # outputs, which may read the parameter servers again.
                if not self._warned:
                    self._warned = True
                    logging.warning(
                        "exactly_once: a step's writes are not one unit (%s): a worker lost while "
                        "they are in flight can still have its step applied twice", "several ps tasks"
                        if not self.one_unit else "the model's own train_step makes them without strategy.one_unit")
                marked = self.mark(step_id, written())
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
