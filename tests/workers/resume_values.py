"""Trains a linear model (Adam or SGD) through ``strategy.fit`` and ``strategy.callbacks(model_dir)``
(so the resume backup is written and restored as in a user's script), and saves every value the
resume tests compare.

    horovodrun -np 2 python resume_values.py OUTDIR MODEL_DIR EPOCHS {adam,sgd}

The mode and its knobs come from the environment (TFSYNC_MODE, ...). Every epoch feeds the same
batches; every rank starts from its own weights (rank 0's are broadcast). Saves
OUTDIR/rank<R>.npz: ``begin.<i>`` / ``end.<i>``, the model's and then the optimizer's variables
(in ``model.variables + optimizer.variables`` order) when training begins (after the backup was
restored and rank 0's state broadcast) and when it ends, and ``names``, their paths.
"""
import os
import sys

import numpy as np

from tests import reference

STEPS = 3


def main(outdir, model_dir, epochs, optimizer):
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras

    strategy = tfsyncmodes.make_strategy()
    rank = strategy.worker_index
    x, y = reference.linear_data(STEPS, strategy.num_replicas_in_sync)

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((x[:, rank], y[:, rank])).unbatch().batch(
            reference.BATCH).repeat()

    class Probe(keras.callbacks.Callback):
        """Every variable's value when training begins (after the callbacks before it) and ends."""

        def values(self):
            return list(self.model.variables) + list(self.model.optimizer.variables)

        def on_train_begin(self, logs=None):
            self.begin = [np.array(v.numpy()) for v in self.values()]

        def on_train_end(self, logs=None):
            names = [getattr(v, "path", v.name) for v in self.values()]
            arrays = {f"begin.{i}": a for i, a in enumerate(self.begin)}
            arrays.update({f"end.{i}": np.array(v.numpy()) for i, v in enumerate(self.values())})
            np.savez(os.path.join(outdir, f"rank{rank}.npz"), names=np.array(names), **arrays)

    with strategy.scope():
        inner = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD}[optimizer](reference.LR)
        keras.utils.set_random_seed(100 + rank)
        model = keras.Sequential([keras.Input((reference.FEATURES,)), keras.layers.Dense(reference.OUTPUTS)])
        model.compile(optimizer=strategy.wrap(inner), loss="mse",
                      jit_compile=False)
    callbacks = strategy.callbacks(model_dir, tensorboard=False) + [Probe()]
    strategy.fit(model, dataset_fn, epochs=epochs, steps_per_epoch=STEPS, callbacks=callbacks, verbose=0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
