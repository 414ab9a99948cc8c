"""Async training under tf_keras (``TF_USE_LEGACY_KERAS=1``), whose ``model.fit`` supports
ParameterServerStrategy itself: tfsyncmodes only makes each step record the version of the
variables it reads, so the wrapped optimizer can measure and temper staleness."""
from __future__ import annotations

import tensorflow as tf
import tf_keras


def fit_legacy(strategy, model, dataset_fn, *, epochs, steps_per_epoch, callbacks, verbose):
    optimizer = model.optimizer
    if not hasattr(optimizer, "begin_step"):
        raise TypeError("async training needs the optimizer from tfsyncmodes.wrap(optimizer, 'async')")
    original_train_step = model.train_step

    def train_step(data):
        read = optimizer.begin_step()
        with tf.control_dependencies([read]):
            logs = original_train_step(data)
        logs["staleness"] = optimizer.step_staleness
        return logs

    model.train_step = train_step
    try:
        return model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn), epochs=epochs,
                         steps_per_epoch=steps_per_epoch, callbacks=list(callbacks),
                         verbose=2 if verbose else 0)  # tf_keras refuses a per-step bar here
    finally:
        del model.train_step
