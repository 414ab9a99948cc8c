"""Keras 3's async step on a parameter-server cluster, and the runner :func:`fit_loop` drives it
with (``ClusterCoordinator.schedule``, one closure per step).

An epoch's metrics are exact: its steps write the metric state on the parameter server, read
once every one of them is done, and tally their staleness there too
(:mod:`~tfsyncmodes.keras.tally`), so the chief fetches nothing of a step as it ends. With
``--sync_steps_ahead=K`` the next epoch's first K steps are scheduled before that wait, so the
workers that are done go on while the last steps end and the chief's end callbacks run; those
K steps write no metric state: each returns its metric updates (worked out from a zero state,
:func:`metric_updates`), which the chief adds to its own epoch's state.
"""
from __future__ import annotations

from typing import Callable, List

import numpy as np
import tensorflow as tf
from absl import logging

from tfsyncmodes.exchange.remedies import dropped_counter
from tfsyncmodes.exchange.version import make_counter_atomic
from tfsyncmodes.keras.loop import StepRunner, sample_batch, to_float
from tfsyncmodes.keras.once import AppliedSteps, AtLeastOnce
from tfsyncmodes.keras.tally import StalenessTally


def async_gradients(model, data):
    """An async step's forward and backward pass on a worker: the variables' version is read
    before the forward pass, so the optimizer can tell how stale the update is when it writes.
    Returns what :func:`async_apply` needs (the gradients, then what the metrics need, the
    batch's size among it) and the inputs `x`; nothing is written yet."""
    import keras

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    read = model.optimizer.begin_step()
    with tf.control_dependencies([read]):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        grads = tape.gradient(loss, model.trainable_variables)
    batch_size = tf.shape(tf.nest.flatten(x)[0])[0]
    return grads, (y, y_pred, sample_weight, loss, batch_size), x


def async_apply(model, grads, batch, x=None, metrics: bool = True):
    """An async step's writes: the update and (unless `metrics` is False) the metrics (`x` goes
    to ``compute_metrics``, which ignores it unless a model overrides it)."""
    optimizer = model.optimizer
    optimizer.apply(grads, model.trainable_variables)
    if metrics:  # the metric state (made atomic by make_metrics_atomic) is read when the epoch ends
        _update_metrics(model, batch, x)
    return {"staleness": optimizer.step_staleness}


def _update_metrics(model, batch, x=None):
    y, y_pred, sample_weight, loss, batch_size = batch
    for metric in model.metrics:
        if metric.name == "loss":  # Keras' loss tracker, weighted by the batch size as in fit
            metric.update_state(loss, sample_weight=batch_size)
    model.compute_metrics(x, y, y_pred, sample_weight)


def metric_updates(model, batch, x=None) -> List[tf.Tensor]:
    """What :func:`async_apply`'s metric writes add to each of ``model.metrics_variables``,
    written nowhere: the updates run on a zero state in a ``keras.StatelessScope`` (Keras'
    metrics add to their state, so the state they leave is what they add)."""
    import keras

    variables = list(model.metrics_variables)
    # make_metrics_atomic's increments write the variable itself: Keras' own for this trace.
    atomic = [(v, v.__dict__.pop("assign_add")) for v in variables if "assign_add" in vars(v)]
    try:
        with keras.StatelessScope(state_mapping=[(v, tf.zeros(v.shape, v.dtype)) for v in variables]) as scope:
            _update_metrics(model, batch, x)
            return [tf.convert_to_tensor(scope.get_current_value(v)) for v in variables]
    finally:
        for variable, assign_add in atomic:
            variable.assign_add = assign_add


def async_train_step(model, data):
    """One async update on a worker: :func:`async_gradients`, then :func:`async_apply`."""
    grads, batch, x = async_gradients(model, data)
    return async_apply(model, grads, batch, x)


def make_metrics_atomic(model) -> None:
    """Keras 3 metric variables (``total``, ``count``) are updated with a read-add-write
    ``assign_add``; on a parameter server, workers updating them at once lose increments (an
    accuracy above 1 was seen). Each becomes the variable's own atomic ``assign_add``, as the
    wrapped optimizer does with ``iterations``."""
    for variable in model.metrics_variables:
        make_counter_atomic(variable)


class CoordinatorRunner(StepRunner):
    """Schedules each step on whichever worker is free (``ClusterCoordinator.schedule``).

    Steps run asynchronously; the epoch's results are fetched when it ends, so the loss is the
    exact mean over the epoch's examples (like every compiled metric, read from its atomically
    updated state once every step is done), the staleness statistics cover every update applied
    (tallied on the parameter server with the update), and ``steps`` counts the steps. Nothing
    of a step is fetched as it ends: its ``RemoteValue`` is not kept (unless steps are scheduled
    ahead, below). With ``--sync_exactly_once`` a step the coordinator runs
    again after its writes landed is skipped (:class:`~tfsyncmodes.keras.once.AppliedSteps`),
    and counted on the parameter server.

    With ``--sync_steps_ahead=K`` the loop schedules the next epoch's first K steps
    (:meth:`step_ahead`) before it waits for an epoch's steps; they return their metric updates,
    added to their epoch's state once its steps are done, before it is read. Their staleness, as
    the dropped updates, counts in the epoch whose end reads it after they ran. The loop then
    waits for an epoch's own steps by their ``RemoteValue``, kept, so each step's outputs are
    fetched as it ends, as before.
    """

    def __init__(self, strategy, dataset_fn: Callable, input_options=None):
        self.strategy = strategy
        self.dataset_fn = dataset_fn
        self.input_options = input_options
        self.steps_ahead = strategy.config.steps_ahead

    def prepare(self, model, steps_per_epoch: int) -> None:
        tf_strategy = self.strategy.tf_strategy
        with tf_strategy.scope():
            model._symbolic_build(data_batch=sample_batch(self.dataset_fn, 1))
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
            # fit_loop waits for every step of an epoch at its end: at most an epoch's steps and
            # the next one's steps ahead are in flight.
            exactly_once = self.strategy.config.exactly_once
            self._once = (AppliedSteps(steps_per_epoch + self.steps_ahead, self.strategy.cluster.num_tasks("ps"))
                          if exactly_once else AtLeastOnce())
            self._tally = StalenessTally()
        make_metrics_atomic(model)
        self._model = model
        self._iterator = iter(self.strategy.distribute_datasets_from_function(self.dataset_fn, self.input_options))
        self._worker_function = tf.function(self.worker_step)
        self._ahead_function = tf.function(self.worker_step_ahead)
        self._optimizer = model.optimizer
        # This epoch's steps (None for each unless steps are scheduled ahead: then each one's
        # RemoteValue, and a step's ahead returns its metric updates); the next epoch's ahead.
        self._pending, self._ahead = [], []
        self._skipped = self._skipped_count()  # re-runs found applied, at the last epoch's end
        self._ran = 0  # steps waited for since the count was taken
        self._count_at_epoch_start = None
        self._dropped = dropped_counter(self._optimizer)  # None unless --sync_max_staleness is set
        # Its base: read here, then at each epoch's end (nothing is dropped with no step in flight).
        self._dropped_at_epoch_start = 0 if self._dropped is None else int(np.asarray(self._dropped))

    def _schedule(self, function):
        if self._count_at_epoch_start is None:  # nothing in flight: the count's base
            self._count_at_epoch_start = int(np.asarray(self._optimizer.iterations))
        return self.strategy.coordinator.schedule(function, args=(self._iterator, self._once.next_id()))

    def step(self):
        # Its RemoteValue dropped: the coordinator copies the outputs of a step whose value is
        # still held to the chief as the step ends, before it hands the worker its next one.
        # With steps ahead it is kept: the epoch's end waits for its own steps by their values.
        remote = self._schedule(self._worker_function)
        self._pending.append(remote if self.steps_ahead else None)
        return {}

    def step_ahead(self):
        """Schedules one of the next epoch's first steps before this epoch's end."""
        self._ahead.append(self._schedule(self._ahead_function))

    def worker_step(self, iterator, step_id):
        """One step on a worker (traced into the scheduled function): its update, unless step
        `step_id` already landed from a worker lost before it reported."""
        return self._worker_step(iterator, step_id, ahead=False)

    def worker_step_ahead(self, iterator, step_id):
        """:meth:`worker_step` of a step scheduled ahead: it writes no metric state and returns
        its metric updates (a re-run that finds the step landed returns zeros)."""
        return self._worker_step(iterator, step_id, ahead=True)

    def _worker_step(self, iterator, step_id, ahead: bool):
        model, tf_strategy = self._model, self.strategy.tf_strategy
        data = next(iterator)
        once = self._once

        def writes(grads, batch, x):  # with the check, one unit on the parameter server
            def apply(grads, batch):  # the update, its metrics, and its staleness in the tally
                outputs = async_apply(model, grads, batch, x, metrics=not ahead)
                with tf.control_dependencies([self._tally.record(outputs["staleness"])]):
                    return tf.nest.map_structure(tf.identity, outputs)

            outputs = once.on_ps(apply, grads, batch)
            return {**outputs, "metrics": metric_updates(model, batch, x)} if ahead else outputs

        return once.run(
            step_id, lambda *computed: tf_strategy.run(writes, args=computed),
            written=lambda: [*model.variables, *model.optimizer.variables, *model.metrics_variables,
                             self._tally.variable],
            inputs=lambda: tf_strategy.run(lambda d: async_gradients(model, d), args=(data,)))

    def _skipped_count(self) -> int:
        """Re-runs that found their step applied, so far (0 unless steps are applied once)."""
        skipped = getattr(self._once, "skipped", None)
        return 0 if skipped is None else int(np.asarray(skipped))

    def finish(self):
        self.strategy.join()
        ran = len(self._pending) + len(self._ahead)
        self._pending, self._ahead, self._count_at_epoch_start, self._ran = [], [], None, 0
        return ran

    def epoch_logs(self, last_step_logs):
        if not self._ahead:
            self.strategy.join()
        steps = len(self._pending)
        # With steps ahead, each of the epoch's steps done (its value fetched); the metric
        # updates of those run ahead of it join its state.
        results = [remote.fetch() for remote in self._pending if remote is not None]
        self._pending, self._ahead = self._ahead, []
        updates = [r["metrics"] for r in results if "metrics" in r]
        if updates:
            for variable, parts in zip(self._model.metrics_variables, zip(*updates)):
                variable.assign_add(np.sum(parts, axis=0).astype(variable.dtype))
        now = self._skipped_count()
        skipped, self._skipped = now - self._skipped, now
        if skipped:
            logging.warning("%d step(s) of this epoch had landed before their worker was lost; "
                            "the coordinator's re-runs found them applied and skipped them", skipped)
        # A worker lost after its update landed and before it reported has its step applied
        # again (unless --sync_exactly_once caught it): the count is one too many. Checked
        # when no step is in flight (with steps ahead, at the last epoch's end).
        self._ran += steps
        if not self._pending:
            executed = self._count_at_epoch_start + self._ran
            counted = int(np.asarray(self._optimizer.iterations))
            if counted != executed:
                logging.warning("optimizer.iterations counted %d updates for the %d steps executed "
                                "(a worker lost while its update was in flight); the count is set to "
                                "the steps", counted - self._count_at_epoch_start, self._ran)
                self._optimizer.iterations.assign(executed)
            self._count_at_epoch_start, self._ran = None, 0
        # Staleness of the updates applied since the last read (a skipped re-run applied none).
        staleness = self._tally.read()
        logs = {key: to_float(value) for key, value in self._model.get_metrics_result().items()}
        logs.update(staleness_mean=staleness.mean, staleness_max=float(staleness.max), steps=float(steps))
        if self._dropped is not None:
            # The exact count: the parameter-server counter every dropped update increments
            # (with steps ahead, those of the next epoch's that ran before this read count here).
            now = int(np.asarray(self._dropped))
            dropped, self._dropped_at_epoch_start = now - self._dropped_at_epoch_start, now
            logs["dropped_updates"] = float(dropped)
            logging.info("dropped %d of %d updates staler than max_staleness", dropped, steps)
        return logs
