"""Trains a linear model through a --sync_mode_schedule of sync and hybrid phases (in-process
switching) and saves what the test needs to check each step against NumPy.

    horovodrun -np 4 python switch_steps.py OUTDIR [--optimizers=sgd,adam] [--epochs=3] [--steps=4]

The schedule and the hybrid knobs come from the environment (TFSYNC_MODE_SCHEDULE,
TFSYNC_GROUP_SIZE, ...). Every epoch feeds the same batches (so the data of step t is
x[t % steps] whether Keras restarts the dataset each epoch or not); every rank starts from its
own weights. Saves OUTDIR/<optimizer>.rank<R>.npz: the weights at the start (after any switch)
and at the end of every step, each step's logged mode, the background rounds applied, History.
"""
import json
import os
import sys

import numpy as np

from tests import reference


def main(argv):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("--optimizers", default="sgd")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)

    import tensorflow as tf
    from absl import logging

    import tfsyncmodes
    from tfsyncmodes.exchange.policies import CrossGroupPolicy
    from tfsyncmodes.keras.compat import keras
    from tfsyncmodes.switching.callback import ModeSwitch

    logging.set_verbosity(logging.INFO)
    strategy = tfsyncmodes.make_strategy()
    rank = strategy.worker_index
    x, y = reference.linear_data(args.steps, strategy.num_replicas_in_sync)

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((x[:, rank], y[:, rank])).unbatch().batch(
            reference.BATCH).repeat()

    def flat(model):
        return np.concatenate([np.asarray(w).reshape(-1) for w in model.get_weights()])

    class Record(keras.callbacks.Callback):
        """Weights at each step's start (after the switch callbacks ran) and end, the mode in
        the batch logs, and the background cross-group rounds applied so far."""

        def on_train_begin(self, logs=None):
            self.begin, self.end, self.modes, self.applied = [], [], [], []

        def on_train_batch_begin(self, batch, logs=None):
            self.begin.append(flat(self.model))

        def on_train_batch_end(self, batch, logs=None):
            self.end.append(flat(self.model))
            self.modes.append(float(logs["mode"]))
            policies = self.model.optimizer.exchange.find(CrossGroupPolicy)
            applied = policies[0].link.rounds_applied() if policies else None
            self.applied.append(applied if applied is not None else -1)

    for name in args.optimizers.split(","):
        with strategy.scope():
            keras.utils.set_random_seed(100 + rank)
            model = keras.Sequential([keras.Input((reference.FEATURES,)),
                                      keras.layers.Dense(reference.OUTPUTS)])
            initial = flat(model)
            inner = keras.optimizers.SGD(reference.LR) if name == "sgd" else keras.optimizers.Adam(reference.LR)
            model.compile(optimizer=strategy.wrap(inner), loss="mse", jit_compile=False)
        record = Record()
        model_dir = os.path.join(args.outdir, name)
        callbacks = strategy.callbacks(model_dir, checkpoint=False) + [record]
        history = strategy.fit(model, dataset_fn, epochs=args.epochs, steps_per_epoch=args.steps,
                               verbose=0, callbacks=callbacks)
        switch = next(c for c in callbacks if isinstance(c, ModeSwitch))
        markers = []
        if strategy.is_chief:
            directory = os.path.join(model_dir, "logs", "switches")
            for event_file in sorted(os.listdir(directory)):
                for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, event_file)):
                    for value in event.summary.value:
                        if value.tag == "mode_switch":
                            markers.append([int(event.step), tf.make_ndarray(value.tensor).item().decode()])
        np.savez(os.path.join(args.outdir, f"{name}.rank{rank}.npz"),
                 initial=initial, begin=np.array(record.begin), end=np.array(record.end), final=flat(model),
                 modes=np.array(record.modes), applied=np.array(record.applied),
                 iterations=int(np.asarray(model.optimizer.iterations)),
                 groups=np.array(strategy.layout.groups), group=strategy.group_index,
                 history=json.dumps(history.history, default=float), switches=json.dumps(switch.switches),
                 markers=json.dumps(markers), strategy_mode=strategy.mode,
                 optimizer_class=type(model.optimizer).__name__, description=strategy.describe())


if __name__ == "__main__":
    main(sys.argv[1:])
