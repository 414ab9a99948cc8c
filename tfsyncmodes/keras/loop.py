"""A ``model.fit``-like loop for Keras 3 where its own ``fit`` refuses the strategy.

Keras 3 ``fit`` fails under MultiWorkerMirroredStrategy (its symbolic build and its metric
reduction both reduce across workers in ways that strategy rejects) and refuses
ParameterServerStrategy. This loop keeps what users rely on from ``fit`` (epochs, steps per
epoch, the Keras callback protocol with progress bar and History, ``model.stop_training``)
and delegates the step itself to a runner: how one step executes is all that differs between
the strategies, so that is all a runner implements.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import numpy as np
import tensorflow as tf
from absl import logging

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange.remedies import dropped_counter
from tfsyncmodes.exchange.version import make_counter_atomic
from tfsyncmodes.keras.once import AppliedSteps, AtLeastOnce


def _to_float(value) -> float:
    return float(np.asarray(value))


class StepRunner:
    """How one training step runs. ``prepare`` is called once, ``step`` once per step."""

    steps_ahead = 0  # steps of the next epoch it schedules before an epoch's end callbacks

    def prepare(self, model, steps_per_epoch: int) -> None:
        raise NotImplementedError

    def step(self) -> Dict[str, object]:
        """Runs one step and returns its logs (values convertible with ``float``)."""
        raise NotImplementedError

    def epoch_logs(self, last_step_logs: Dict[str, object]) -> Dict[str, float]:
        """Logs for the epoch; Keras metrics accumulate over the epoch, so the last step's."""
        return {key: _to_float(value) for key, value in last_step_logs.items()}

    def finish(self) -> int:
        """Waits for the steps scheduled ahead of an epoch that will not run; returns how many."""
        return 0


def sample_batch(dataset_fn: Callable, num_replicas: int):
    """One per-replica batch, for building the model's variables before distribution."""
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=num_replicas)
    return next(iter(dataset_fn(context)))


class StrategyRunner(StepRunner):
    """Runs ``model.train_step`` on every replica with ``strategy.run`` and averages the logs."""

    def __init__(self, strategy, dataset_fn: Callable, input_options=None):
        self.strategy = strategy
        self.dataset_fn = dataset_fn
        self.input_options = input_options

    def prepare(self, model, steps_per_epoch: int) -> None:
        del steps_per_epoch
        tf_strategy = self.strategy.tf_strategy
        batch = sample_batch(self.dataset_fn, self.strategy.num_replicas_in_sync)
        with tf_strategy.scope():
            model._symbolic_build(data_batch=batch)
        self._iterator = iter(tf_strategy.distribute_datasets_from_function(self.dataset_fn, self.input_options))

        @tf.function
        def train_function(iterator):
            logs = tf_strategy.run(model.train_step, args=(next(iterator),))
            return {key: tf_strategy.reduce("MEAN", value, axis=None) for key, value in logs.items()}

        self._train_function = train_function

    def step(self):
        return self._train_function(self._iterator)


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


def async_apply(model, grads, batch, x=None):
    """An async step's writes: the update and the metrics (`x` goes to ``compute_metrics``,
    which ignores it unless a model overrides it)."""
    y, y_pred, sample_weight, loss, batch_size = batch
    optimizer = model.optimizer
    optimizer.apply(grads, model.trainable_variables)
    # The metric state (made atomic by make_metrics_atomic) is read when the epoch ends.
    for metric in model.metrics:
        if metric.name == "loss":  # Keras' loss tracker, weighted by the batch size as in fit
            metric.update_state(loss, sample_weight=batch_size)
    model.compute_metrics(x, y, y_pred, sample_weight)
    return {"staleness": optimizer.step_staleness}


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
    updated state once every step is done), the staleness statistics cover every update whose
    worker reported it, and ``steps`` counts the steps. With ``--sync_exactly_once`` a
    step the coordinator runs again after its writes landed is skipped
    (:class:`~tfsyncmodes.keras.once.AppliedSteps`).

    With ``--sync_steps_ahead=K`` the loop schedules the next epoch's first K steps once an
    epoch's steps are done and its metrics read, before its end callbacks run: the workers
    train while the chief checkpoints and evaluates, where they would otherwise wait.
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
            # fit_loop waits for every step at an epoch's end: at most an epoch's steps in flight.
            exactly_once = self.strategy.config.exactly_once
            self._once = (AppliedSteps(steps_per_epoch, self.strategy.cluster.num_tasks("ps"))
                          if exactly_once else AtLeastOnce())
        make_metrics_atomic(model)
        self._model = model
        self._iterator = iter(self.strategy.distribute_datasets_from_function(self.dataset_fn, self.input_options))
        self._worker_function = tf.function(self.worker_step)
        self._optimizer = model.optimizer
        self._pending = []
        self._count_at_epoch_start = None
        self._dropped = dropped_counter(self._optimizer)  # None unless --sync_max_staleness is set
        self._dropped_at_epoch_start = 0

    def step(self):
        if self._count_at_epoch_start is None:
            self._count_at_epoch_start = int(np.asarray(self._optimizer.iterations))
            if self._dropped is not None:
                self._dropped_at_epoch_start = int(np.asarray(self._dropped))
        self._pending.append(self.strategy.coordinator.schedule(
            self._worker_function, args=(self._iterator, self._once.next_id())))
        return {}

    def worker_step(self, iterator, step_id):
        """One step on a worker (traced into the scheduled function): its update, unless step
        `step_id` already landed from a worker lost before it reported."""
        model, tf_strategy = self._model, self.strategy.tf_strategy
        data = next(iterator)
        once = self._once

        def writes(grads, batch, x):  # with the check, one unit on the parameter server
            return once.on_ps(lambda g, b: async_apply(model, g, b, x), grads, batch)

        return once.run(
            step_id, lambda *computed: tf_strategy.run(writes, args=computed),
            written=lambda: [*model.variables, *model.optimizer.variables, *model.metrics_variables],
            inputs=lambda: tf_strategy.run(lambda d: async_gradients(model, d), args=(data,)))

    def finish(self):
        self.strategy.join()
        ran, self._pending, self._count_at_epoch_start = len(self._pending), [], None
        return ran

    def epoch_logs(self, last_step_logs):
        self.strategy.join()
        results = [remote.fetch() for remote in self._pending]
        self._pending = []
        applied = np.array([int(np.asarray(r["applied"])) for r in results], bool)
        if not applied.all():
            logging.warning("%d step(s) of this epoch had landed before their worker was lost; "
                            "the coordinator's re-runs found them applied and skipped them",
                            int((~applied).sum()))
        # A worker lost after its update landed and before it reported has its step applied
        # again (unless --sync_exactly_once caught it): the count is one too many.
        executed = self._count_at_epoch_start + len(results)
        counted = int(np.asarray(self._optimizer.iterations))
        if counted != executed:
            logging.warning("optimizer.iterations counted %d updates for the %d steps executed "
                            "(a worker lost while its update was in flight); the count is set to "
                            "the steps", counted - self._count_at_epoch_start, len(results))
            self._optimizer.iterations.assign(executed)
        self._count_at_epoch_start = None
        # Staleness as measured by the runs that reported it (a skipped re-run measured none).
        staleness = np.array([int(np.asarray(r["staleness"])) for r, a in zip(results, applied) if a]
                             or [0])
        logs = {key: _to_float(value) for key, value in self._model.get_metrics_result().items()}
        logs.update(staleness_mean=float(staleness.mean()), staleness_max=float(staleness.max()),
                    steps=float(len(results)))
        if self._dropped is not None:
            # The exact count: the parameter-server counter every dropped update increments.
            dropped = int(np.asarray(self._dropped)) - self._dropped_at_epoch_start
            logs["dropped_updates"] = float(dropped)
            logging.info("dropped %d of %d updates staler than max_staleness", dropped, len(results))
        return logs


def fit_loop(model, runner: StepRunner, *, epochs: int, steps_per_epoch: Optional[int],
             callbacks: Sequence = (), verbose: int = 1, initial_epoch: int = 0):
    """Trains `model` for `epochs` x `steps_per_epoch` steps of `runner`; returns the History."""
    import keras

    if not steps_per_epoch or steps_per_epoch < 1:
        raise ConfigError("fit", "steps_per_epoch",
                          "this strategy's training loop needs a fixed number of steps per epoch",
                          "pass steps_per_epoch=N (N >= 1) and repeat() the dataset")
    runner.prepare(model, steps_per_epoch)
    callback_list = keras.callbacks.CallbackList(
        list(callbacks), add_history=True, add_progbar=verbose != 0, verbose=verbose,
        epochs=epochs, steps=steps_per_epoch, model=model)
    model.stop_training = False
    callback_list.on_train_begin()
    # BackupAndRestore sets this when it restores an interrupted run, as Keras' fit honours.
    initial_epoch = getattr(model, "_initial_epoch", None) or initial_epoch
    epoch_logs: Dict[str, float] = {}
    ahead = 0  # steps of this epoch scheduled before the last epoch's end callbacks
    for epoch in range(initial_epoch, epochs):
        if not ahead:
            model.reset_metrics()
        callback_list.on_epoch_begin(epoch)
        logs = {}
        for step in range(steps_per_epoch):
            callback_list.on_train_batch_begin(step)
            logs = runner.step() if step >= ahead else {}
            callback_list.on_train_batch_end(step, logs)
            if model.stop_training:
                break
        epoch_logs = runner.epoch_logs(logs)
        ahead = 0
        if epoch + 1 < epochs and not model.stop_training and runner.steps_ahead:
            # The epoch's metrics are read: the next epoch's first steps run during its end.
            ahead = min(runner.steps_ahead, steps_per_epoch)
            model.reset_metrics()
            for _ in range(ahead):
                runner.step()
        callback_list.on_epoch_end(epoch, epoch_logs)
        if model.stop_training:
            if ahead:
                logging.warning("training stopped at epoch %d's end; the %d step(s) of the next epoch "
                             "scheduled ahead of it (steps_ahead) ran", epoch + 1, runner.finish())
            break
    callback_list.on_train_end(logs=epoch_logs)
    return model.history
