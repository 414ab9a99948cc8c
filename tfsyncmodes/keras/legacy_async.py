"""Async training under tf_keras (``TF_USE_LEGACY_KERAS=1``), whose ``model.fit`` supports
ParameterServerStrategy itself: tfsyncmodes only makes each step record the version of the
variables it reads, so the wrapped optimizer can measure and temper staleness.

tf_keras reads each epoch's logs from the model's metrics (updated by every worker with
atomic ``assign_add`` on the parameter servers) only when the step's logs have the same keys
as ``model.get_metrics_result()``; otherwise it falls back to whichever step it fetched last,
which under concurrent workers misses the updates that landed after it. The step's
``staleness`` is therefore kept in a variable too and reported by ``get_metrics_result``, and
so is the epoch's count of updates dropped by ``--sync_max_staleness`` (``dropped_updates``).

tf_keras schedules ``model.train_function`` once per step; here it carries a step id, so that
with ``--sync_exactly_once`` a step the coordinator runs again after its writes landed is
skipped (:class:`~tfsyncmodes.keras.once.AppliedSteps`; with ``steps_per_execution`` 1, its default).
Then a model that keeps tf_keras' own ``train_step`` and ``compute_loss`` trains with
:func:`one_unit_train_step`, whose writes land as one unit on the parameter server.
"""
from __future__ import annotations

import contextlib

import tensorflow as tf
import tf_keras
from absl import logging

from tfsyncmodes.exchange.base import optimizer_variables
from tfsyncmodes.exchange.remedies import StaleUpdateDrop
from tfsyncmodes.keras.once import AppliedSteps, AtLeastOnce


def applied_once(model, once, extra=()):
    """A ``make_train_function`` for `model` whose scheduled steps each apply once."""
    build = model.make_train_function

    def make_train_function(force=False):
        if model.train_function is not None and not force:
            return model.train_function
        build(force=True)  # tf_keras' own, compiled as model.train_tf_function
        coordinator = model._cluster_coordinator
        inner = getattr(model, "train_tf_function", None)
        if coordinator is None or inner is None or int(model._steps_per_execution.numpy()) != 1:
            if isinstance(once, AppliedSteps):
                logging.warning("exactly_once: steps_per_execution %d schedules several steps as one; "
                                "a lost worker's steps are applied at least once",
                                int(model._steps_per_execution.numpy()))
            return model.train_function  # several steps per execution: tf_keras' at least once

        def written():
            metrics = [v for metric in model.metrics for v in metric.variables]
            return [*model.variables, *optimizer_variables(model.optimizer), *metrics,
                    model._train_counter, *extra]

        @tf.function
        def train_function(iterator, step_id):
            logs = once.run(step_id, lambda: inner.python_function(iterator), written)
            return {key: value for key, value in logs.items() if key != "applied"}

        model.train_function = lambda it: coordinator.schedule(train_function, args=(it, once.next_id()))
        return model.train_function

    return make_train_function


@contextlib.contextmanager
def _muted(metrics):
    """While traced inside this block, the metrics' ``update_state`` does nothing."""
    saved = [(metric, metric.__dict__.get("update_state")) for metric in metrics]
    for metric, _ in saved:
        metric.update_state = lambda *args, **kwargs: None
    try:
        yield
    finally:
        for metric, update_state in saved:
            if update_state is None:
                del metric.update_state
            else:
                metric.update_state = update_state


def keeps_default_step(model) -> bool:
    """Whether `model` trains with tf_keras' own ``train_step`` and ``compute_loss`` (compiled)."""
    base = tf_keras.Model
    return (type(model).train_step is base.train_step and type(model).compute_loss is base.compute_loss
            and getattr(model, "compiled_loss", None) is not None)


def one_unit_train_step(model, once, record):
    """tf_keras' ``Model.train_step`` (forward, loss, gradients, update, metrics) with the
    update, the metrics and ``record(logs)`` (the step's own counters) made by
    :meth:`AppliedSteps.on_ps <tfsyncmodes.keras.once.AppliedSteps.on_ps>` as one unit on the
    parameter server. tf_keras' compiled loss updates its loss metrics as it computes the
    loss; those updates are held back from the forward pass and made in the unit, from the
    same targets, predictions and regularization losses."""
    optimizer = model.optimizer
    container = model.compiled_loss
    loss_metrics = [m for m in [getattr(container, "_total_loss_mean", None),
                                *(getattr(container, "_per_output_metrics", None) or [])] if m is not None]

    def train_step(data):
        x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(data)
        variables = model.trainable_variables
        read = optimizer.begin_step()
        with tf.control_dependencies([read]), _muted(loss_metrics):
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                loss = model.compute_loss(x, y, y_pred, sample_weight)
            regularization = list(model.losses)
        model._validate_target_and_loss(y, loss)
        grads = [g for g, _ in optimizer.compute_gradients(loss, variables, tape=tape)]

        def writes(grads, y, y_pred, sample_weight, regularization):
            optimizer.apply_gradients(zip(grads, variables))
            container(y, y_pred, sample_weight, regularization_losses=regularization)
            return record(model.compute_metrics(x, y, y_pred, sample_weight))

        return once.on_ps(writes, grads, y, y_pred, sample_weight, regularization)

    return train_step


def fit_legacy(strategy, model, dataset_fn, *, epochs, steps_per_epoch, callbacks, verbose, input_options=None):
    optimizer = model.optimizer
    if not hasattr(optimizer, "begin_step"):
        raise TypeError("async training needs the optimizer from tfsyncmodes.wrap(optimizer, 'async')")

    original_train_step = model.train_step
    original_metrics_result = model.get_metrics_result
    original_reset_metrics = model.reset_metrics
    bounded = bool(optimizer.exchange.find(StaleUpdateDrop))  # --sync_max_staleness is set
    with strategy.scope():
        last_staleness = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfsync_last_staleness")
        # The epoch's dropped updates, added to atomically on the ps by every worker's step.
        epoch_dropped = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfsync_epoch_dropped")
        # tf_keras waits for every step at an epoch's end: at most an epoch's steps in flight.
        if not steps_per_epoch:
            once = None  # tf_keras refuses this strategy without it
        else:
            once = (AppliedSteps(steps_per_epoch, strategy.cluster.num_tasks("ps"))
                    if strategy.config.exactly_once else AtLeastOnce())

    def record(logs):
        """The step's staleness, and its dropped update if any, in their variables."""
        staleness = tf.cast(optimizer.step_staleness, tf.int64)
        with tf.control_dependencies([last_staleness.assign(staleness)]):
            logs["staleness"] = tf.identity(staleness)
        if bounded:
            dropped = tf.cast(optimizer.exchange.step_logs()["dropped"], tf.int64)
            with tf.control_dependencies([epoch_dropped.assign_add(dropped, read_value=False)]):
                logs["dropped_updates"] = tf.identity(dropped)
        return logs

    units = []  # steps traced whose writes went through strategy.one_unit

    def one_unit(writes, *values):
        units.append(writes)
        return (once or AtLeastOnce()).on_ps(lambda *held: record(writes(*held)), *values)

    def plain_train_step(data):
        read = optimizer.begin_step()
        traced = len(units)
        with tf.control_dependencies([read]):
            logs = original_train_step(data)
        return logs if len(units) > traced else record(logs)  # recorded in the unit

    train_step = plain_train_step
    if getattr(once, "one_unit", False) and keeps_default_step(model):
        train_step = one_unit_train_step(model, once, record)

    def get_metrics_result():
        results = original_metrics_result()
        results["staleness"] = last_staleness.read_value()
        if bounded:
            results["dropped_updates"] = epoch_dropped.read_value()
        if bounded and tf.executing_eagerly():  # fit reading the epoch's logs, not a step
            logging.info("dropped %d updates staler than max_staleness this epoch",
                         int(results["dropped_updates"]))
        return results

    def reset_metrics():  # at the start of every epoch, once the last one's steps are done
        original_reset_metrics()
        epoch_dropped.assign(0)

    model.train_step = train_step
    strategy.step_unit = one_unit  # for a model's own train_step: strategy.one_unit
    model.get_metrics_result = get_metrics_result
    model.reset_metrics = reset_metrics
    if once is not None:
        model.make_train_function = applied_once(model, once, (last_staleness, epoch_dropped))
        model.train_function = None  # built again, with step ids
    try:
        history = model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn, input_options), epochs=epochs,
                            steps_per_epoch=steps_per_epoch, callbacks=list(callbacks),
                            verbose=2 if verbose else 0)  # tf_keras refuses a per-step bar here
        skipped = int(once.skipped.numpy()) if getattr(once, "skipped", None) is not None else 0
        if skipped:
            logging.warning("%d step(s) had landed before their worker was lost; the coordinator's "
                            "re-runs found them applied and skipped them", skipped)
        return history
    finally:
        strategy.step_unit = None
        del model.train_step
        del model.get_metrics_result
        del model.reset_metrics
        if once is not None:
            del model.make_train_function
