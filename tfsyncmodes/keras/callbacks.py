"""Callbacks that a mode requires, for the Keras in use (see :mod:`tfsyncmodes.keras.compat`).

Horovod's own ``horovod.tensorflow.keras`` callbacks do not support Keras 3; these run
Horovod's tensor collectives through :mod:`tfsyncmodes.exchange.communicators` and work with
both Keras versions.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfsyncmodes.exchange import communicators
from tfsyncmodes.keras.compat import build_optimizer, keras


class BroadcastInitialState(keras.callbacks.Callback):
    """Copies rank `root_rank`'s model and optimizer variables to every rank before training.

    The optimizer is built first, so its slots exist and are broadcast too; after this every
    rank starts from identical state, and the averaged updates keep them identical.
    """

    def __init__(self, root_rank: int = 0, process_set=None):
        super().__init__()
        self.root_rank = root_rank
        self.process_set = process_set
        self.done = False

    def on_train_begin(self, logs=None):
        if self.done:
            return
        model = self.model
        optimizer = model.optimizer
        build_optimizer(model)  # tf_keras says `_built`, not `built`
        variables = list(model.variables)
        if optimizer is not None:
            variables += list(optimizer.variables)
        communicators.broadcast_variables(variables, self.root_rank, "tfsync.broadcast", self.process_set)
        self.done = True


class MetricAverage(keras.callbacks.Callback):
    """Replaces each epoch's logs with their average over all ranks (before later callbacks,
    such as checkpointing and History, see them)."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        for key in sorted(logs):
            value = logs[key]
            if isinstance(value, (int, float, np.floating, np.integer)) or tf.is_tensor(value):
                averaged = communicators.world_average(tf.constant(float(value), tf.float64),
                                                       f"tfsync.metric.{key}")
                logs[key] = float(averaged.numpy())
