"""Trains a small MLP under ``--sync_switch_policy=straggler`` and saves what the test checks.

    horovodrun -np 4 python switch_policy_run.py OUTDIR [--epochs=6] [--steps=20]

The policy's knobs and the straggler come from the environment (TFSYNC_SWITCH_POLICY,
TFSYNC_SLOW_WORKER=1:4.0@30%-60%, ...). Saves OUTDIR/rank<R>.npz: each step's logged mode and (epoch, batch), the History, the optimizer's step count, the
policy's decisions (with the step times they were made from), the switches, the final weights,
the Horovod process sets other than the world's at each step's end where they changed;
the chief also the TensorBoard scalars of the per-rank step times.
"""
import json
import os
import sys

import numpy as np


def main(argv):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)

    import tensorflow as tf
    from absl import logging

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras
    from tfsyncmodes.switching.straggler import StragglerSwitch

    logging.set_verbosity(logging.INFO)
    strategy = tfsyncmodes.make_strategy()
    rank = strategy.worker_index
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((64 * args.steps, 64)).astype("float32")
    y = (x[:, :10].argmax(axis=1)).astype("int32")

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(64, drop_remainder=True).repeat()

    import horovod.tensorflow as hvd

    modes, batches, sets = [], [], []

    def registered():  # Horovod's own table: the sets it negotiates every cycle
        from horovod.tensorflow.mpi_ops import _basics

        table = _basics._get_process_set_ids_and_ranks()
        return sorted(sorted(ranks) for ranks in table.values() if len(ranks) < hvd.size())

    class Record(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            modes.append(float(logs["mode"]))
            batches.append([self.epoch, batch])
            now = registered()
            if not sets or sets[-1][1] != now:
                sets.append([len(modes) - 1, now])

    with strategy.scope():
        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=strategy.wrap(keras.optimizers.Adam(0.01)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    model_dir = os.path.join(args.outdir, "model")
    callbacks = strategy.callbacks(model_dir, checkpoint=False) + [Record()]
    history = strategy.fit(model, dataset_fn, epochs=args.epochs, steps_per_epoch=args.steps, verbose=0,
                 callbacks=callbacks)
    policy = next(c for c in callbacks if isinstance(c, StragglerSwitch))
    decisions = [{"mode": d.mode, "switched": d.switched, "ratio": d.ratio, "times": list(d.times),
                  "steps": [list(own) for own in d.steps], "groups": [list(g) for g in d.groups]}
                 for d in policy.decisions]
    scalars = {}
    if strategy.is_chief:
        directory = os.path.join(model_dir, "logs", "switches")
        for event_file in sorted(os.listdir(directory)):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, event_file)):
                for value in event.summary.value:
                    if value.tag.startswith("switch_policy/step_ms_rank_"):
                        scalars.setdefault(value.tag, []).append(
                            [int(event.step), float(tf.make_ndarray(value.tensor))])
    weights = np.concatenate([np.asarray(w).reshape(-1) for w in model.get_weights()])
    np.savez(os.path.join(args.outdir, f"rank{rank}.npz"), modes=np.array(modes), final=weights,
             decisions=json.dumps(decisions), switches=json.dumps(policy.switches),
             scalars=json.dumps(scalars), interval=policy.interval, strategy_mode=strategy.mode,
             batches=np.array(batches), sets=json.dumps(sets), history=json.dumps({k: [float(v) for v in vs] for k, vs in history.history.items()}),
             iterations=int(np.asarray(model.optimizer.iterations)))


if __name__ == "__main__":
    main(sys.argv[1:])
