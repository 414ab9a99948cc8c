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


def to_float(value) -> float:
    return float(np.asarray(value))


class StepRunner:
    """How one training step runs. ``prepare`` is called once, ``step`` once per step."""

    steps_ahead = 0  # steps of the next epoch it schedules before it waits for an epoch's last

    def prepare(self, model, steps_per_epoch: int) -> None:
        raise NotImplementedError

    def step(self) -> Dict[str, object]:
        """Runs one step and returns its logs (values convertible with ``float``)."""
        raise NotImplementedError

    def epoch_logs(self, last_step_logs: Dict[str, object]) -> Dict[str, float]:
        """Logs for the epoch; Keras metrics accumulate over the epoch, so the last step's."""
        return {key: to_float(value) for key, value in last_step_logs.items()}

    def step_ahead(self) -> None:
        """Schedules one of the next epoch's first steps before this epoch's end (runners whose
        ``steps_ahead`` is not 0)."""
        raise NotImplementedError

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
    ahead = 0  # steps of this epoch scheduled before the last one ended
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callback_list.on_epoch_begin(epoch)
        logs = {}
        for step in range(steps_per_epoch):
            callback_list.on_train_batch_begin(step)
            logs = runner.step() if step >= ahead else {}
            callback_list.on_train_batch_end(step, logs)
            if model.stop_training:
                break
        ahead = 0
        if epoch + 1 < epochs and not model.stop_training and runner.steps_ahead:
            # The next epoch's first steps, for the workers done before this epoch's last steps
            # and while its end callbacks run (they write no metric state: see the runner).
            ahead = min(runner.steps_ahead, steps_per_epoch)
            for _ in range(ahead):
                runner.step_ahead()
        epoch_logs = runner.epoch_logs(logs)
        callback_list.on_epoch_end(epoch, epoch_logs)
        if model.stop_training:
            if ahead:
                logging.warning("training stopped at epoch %d's end; the %d step(s) of the next epoch "
                             "scheduled ahead of it (steps_ahead) ran", epoch + 1, runner.finish())
            break
    callback_list.on_train_end(logs=epoch_logs)
    return model.history
