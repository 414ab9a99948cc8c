"""Callbacks that a mode requires, for the Keras in use (see :mod:`tfsyncmodes.keras.compat`).

Horovod's own ``horovod.tensorflow.keras`` callbacks do not support Keras 3; these call
``horovod.tensorflow`` tensor ops directly and work with both Keras versions.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfsyncmodes.keras.compat import keras


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
        import horovod.tensorflow as hvd

        model = self.model
        optimizer = model.optimizer
        if optimizer is not None and hasattr(optimizer, "build") and not getattr(optimizer, "built", True):
            optimizer.build(model.trainable_variables)
        variables = list(model.variables)
        if optimizer is not None:
            variables += list(optimizer.variables)
        kwargs = {} if self.process_set is None else {"process_set": self.process_set}
        for index, variable in enumerate(variables):
            value = hvd.broadcast(tf.convert_to_tensor(variable), self.root_rank,
                                  name=f"tfsync.broadcast.{index}", **kwargs)
            variable.assign(value)
        self.done = True


class MetricAverage(keras.callbacks.Callback):
    """Replaces each epoch's logs with their average over all ranks (before later callbacks,
    such as checkpointing and History, see them)."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        import horovod.tensorflow as hvd

        for key in sorted(logs):
            value = logs[key]
            if isinstance(value, (int, float, np.floating, np.integer)) or tf.is_tensor(value):
                averaged = hvd.allreduce(tf.constant(float(value), tf.float64), op=hvd.Average,
                                         name=f"tfsync.metric.{key}")
                logs[key] = float(averaged.numpy())
