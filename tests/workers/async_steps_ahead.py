"""Chief of a real PS cluster (2 workers): what ``--sync_steps_ahead`` does to Keras 3's async
loop, saved as JSON.

    python -m tfsyncmodes.launch --workers 2 --ps 1 -- python async_steps_ahead.py OUTDIR AHEAD

A model whose loss is linear in its kernel (every step's gradient is the batch's mean features,
whichever weights it read, so the final kernel says how many updates landed) trains EPOCHS x
STEPS steps of plain SGD with ``steps_ahead=AHEAD``, worker 1's steps much slower than worker
0's (STEP_SLEEPS). At each epoch's end a callback reads
``optimizer.iterations``, waits (a chief that checkpoints and evaluates) until the steps ahead have
landed or WAIT_LIMIT seconds have passed, then PAUSE seconds more, in which no further step may
land, reads it again, and keeps the epoch's logs, among them a metric that counts the examples its epoch
saw. With AHEAD > 0 a second fit, whose steps take STOPPED_STEP_SLEEPS each, stops at its first
epoch's end (``model.stop_training``, no pause), while the steps run ahead are still running.
"""
import json
import os
import sys
import time

import numpy as np

FEATURES, BATCH, STEPS, EPOCHS, LR, PAUSE = 8, 16, 12, 3, 0.01, 1.5
WAIT_LIMIT = 30.0  # seconds the callback waits at most for the steps ahead: a loaded machine is slow
STEP_SLEEPS = (0.5, 2.5)  # seconds a batch takes on worker 0 and on worker 1: worker 0 runs
# fewer than 6 steps while worker 1 runs one, so worker 1 takes one of 6 steps ahead, and the
# steps ahead take seconds to land (a loaded machine's chief may begin its callback late)
STOPPED_STEP_SLEEPS = (0.4, 0.4)  # the stopped fit's: still running when its callback stops it


def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((BATCH, FEATURES)).astype("float32")


def main(outdir, ahead):
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras

    # Without staleness-aware scaling every update is LR x the gradient, whichever worker made it.
    strategy = tfsyncmodes.make_strategy("async", steps_ahead=ahead, staleness_aware_lr=False)
    x = data()

    def dataset_fn(context, sleeps):
        del context
        try:  # traced for a worker (a tensor); the chief's own sample batch waits none
            sleep = tf.gather(tf.constant(sleeps, tf.float64),
                              tf.distribute.coordinator.experimental_get_current_worker_index())
        except RuntimeError:
            sleep = tf.constant(0.0, tf.float64)

        def slow(features, seconds):  # every batch takes a while, so steps ahead still run later
            time.sleep(float(seconds))
            return features

        def delayed(features, labels):
            features = tf.numpy_function(slow, [features, sleep], tf.float32, stateful=True)
            return tf.ensure_shape(features, (BATCH, FEATURES)), labels

        batch = tf.data.Dataset.from_tensors((x, np.zeros((BATCH, 1), "float32"))).repeat()
        return batch.map(delayed)

    class Seen(keras.metrics.Metric):
        """The examples the epoch's steps counted."""

        def __init__(self, name="seen", **kwargs):
            super().__init__(name=name, **kwargs)
            self.total = self.add_variable(shape=(), initializer="zeros", name="total")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.total.assign_add(tf.cast(tf.shape(y_pred)[0], self.total.dtype))

        def result(self):
            return tf.convert_to_tensor(self.total)

    class Record(keras.callbacks.Callback):
        def __init__(self, stop_at_first=False):
            super().__init__()
            self.stop_at_first, self.epochs = stop_at_first, []

        def iterations(self):
            return int(np.asarray(self.model.optimizer.iterations))

        def on_epoch_end(self, epoch, logs=None):
            entry = self.iterations()
            if not self.stop_at_first:
                # The steps ahead, if any, land while the callback runs; then PAUSE seconds more.
                expected = (epoch + 1) * STEPS + (ahead if epoch + 1 < EPOCHS else 0)
                deadline = time.monotonic() + WAIT_LIMIT
                while self.iterations() < expected and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(PAUSE)
            self.epochs.append({"epoch": epoch, "at_entry": entry, "after_pause": self.iterations(),
                                "seen": float(logs["seen"]), "steps": float(logs["steps"])})
            if self.stop_at_first:
                self.model.stop_training = True

    def fit(epochs, stop_at_first):
        with strategy.scope():
            model = keras.Sequential([keras.Input((FEATURES,)),
                                      keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
            model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.SGD(LR), "async"), jit_compile=False,
                          metrics=[Seen()], loss=lambda y_true, y_pred: tf.reduce_mean(y_pred))
        record = Record(stop_at_first)
        sleeps = STOPPED_STEP_SLEEPS if stop_at_first else STEP_SLEEPS
        history = strategy.fit(model, lambda context: dataset_fn(context, sleeps), epochs=epochs,
                               steps_per_epoch=STEPS, verbose=0, callbacks=[record])
        returned = int(np.asarray(model.optimizer.iterations))  # read as fit returns
        time.sleep(1.0)
        return {"epochs": record.epochs, "history_epochs": list(history.epoch), "returned": returned,
                "later": int(np.asarray(model.optimizer.iterations)),
                "kernel": np.asarray(model.get_weights()[0]).ravel().tolist()}

    results = {"full": fit(EPOCHS, False)}
    if ahead:
        results["stopped"] = fit(EPOCHS, True)
    with open(os.path.join(outdir, "steps_ahead.json"), "w") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
