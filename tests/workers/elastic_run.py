"""An elastic sync job for tests/test_elastic.py, run by ``horovodrun --min-np/--max-np``:
a softmax regression on fixed synthetic data through ``strategy.fit``.

Environment: ELASTIC_OUT (a directory: each rank still there at the end writes
``rank<R>.npz`` with its weights, its optimizer's step count and the History), ELASTIC_KILL
``SIZE:EPOCH:STEP`` (the last rank of a world of SIZE exits at once before that step; the time
of the exit and of the first step finished in the new world are printed), ELASTIC_HANG
``SIZE:EPOCH:STEP:RANK`` (that rank of a world of SIZE never finishes that step: its batch end
sleeps, as a step whose collective Horovod leaves pending when a peer is lost),
ELASTIC_ADD ``EPOCH:STEP:FILE:LINE`` (rank 0 appends LINE to the discovery script's FILE after
that step of that epoch, then waits ADD_WAIT s so that Horovod's driver has seen it before the
next step), ELASTIC_JOIN_DELAY ``RANK:SECONDS`` (a process started as that rank or a higher one,
i.e. one that joins, sleeps that long before it starts Horovod: a slow start-up), ELASTIC_EPOCHS, ELASTIC_STEPS; the mode and its knobs from TFSYNC_* (hybrid: the
npz also has ``groups``, the number of groups the cross-group exchange links at the end; every
run its final ``learning_rate``). The optimizer is SGD at LEARNING_RATE. A rank still running
after STACKS_AFTER s (far beyond a job's 20-60 s) prints every thread's stack: a hang's trace."""
import faulthandler
import json
import os
import sys
import time

import numpy as np

FEATURES, CLASSES, PER_RANK_BATCH, LEARNING_RATE, ADD_WAIT = 8, 3, 16, 0.5, 4.0
STACKS_AFTER = 150


def data(rows=4096, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    truth = np.random.default_rng(99).normal(size=(FEATURES, CLASSES))
    return x, (x @ truth).argmax(axis=1).astype("int64")


def main():
    faulthandler.dump_traceback_later(STACKS_AFTER, exit=False)
    import tensorflow as tf
    import horovod.tensorflow as hvd
    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras

    epochs, steps = int(os.environ.get("ELASTIC_EPOCHS", 4)), int(os.environ.get("ELASTIC_STEPS", 12))
    delay = os.environ.get("ELASTIC_JOIN_DELAY")
    if delay and int(os.environ["HOROVOD_RANK"]) >= int(delay.split(":")[0]):
        time.sleep(float(delay.split(":")[1]))
    strategy = tfsyncmodes.make_strategy()
    x, y = data()
    with strategy.scope():
        tf.random.set_seed(100 + hvd.rank())  # ranks start apart; the state is rank 0's
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)])
        model.compile(optimizer=strategy.wrap(keras.optimizers.SGD(LEARNING_RATE)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], jit_compile=False)

    def dataset_fn(ctx):
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).repeat().batch(PER_RANK_BATCH)

    class Faults(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            kill = os.environ.get("ELASTIC_KILL")
            if kill:
                size, epoch, step = map(int, kill.split(":"))
                if hvd.size() == size and hvd.rank() == size - 1 and self.epoch == epoch and batch == step:
                    print(f"rank {hvd.rank()} exits at epoch {epoch} step {step} at {time.time():.3f}",
                          flush=True)
                    os._exit(1)

        def on_train_batch_end(self, batch, logs=None):
            hang = os.environ.get("ELASTIC_HANG")
            if hang:
                size, epoch, step, rank = map(int, hang.split(":"))
                if (hvd.size(), hvd.rank(), self.epoch, batch) == (size, rank, epoch, step):
                    print(f"rank {rank} hangs in epoch {epoch} step {step}", flush=True)
                    time.sleep(3600)
            add = os.environ.get("ELASTIC_ADD")
            if add and hvd.rank() == 0 and hvd.size() == 2:
                epoch, step, path, line = add.split(":", 3)
                if (self.epoch, batch + 1) == (int(epoch), int(step)):
                    with open(path, "a") as hosts:
                        hosts.write(line + "\n")
                    time.sleep(ADD_WAIT)  # the driver reads the script every second
            if hvd.size() != self.__dict__.setdefault("size", hvd.size()):
                self.size = hvd.size()
                if hvd.rank() == 0:
                    print(f"first step in a world of {self.size} at {time.time():.3f}", flush=True)

    callbacks = [Faults()]
    if os.environ.get("ELASTIC_MODEL_DIR"):  # the strategy's backup, checkpoint and TensorBoard
        callbacks = strategy.callbacks(os.environ["ELASTIC_MODEL_DIR"]) + callbacks
    if os.environ.get("ELASTIC_TENSORBOARD") and hvd.rank() == 0:  # the user's TensorBoard, on rank 0
        callbacks.append(keras.callbacks.TensorBoard(os.environ["ELASTIC_TENSORBOARD"]))
    history = strategy.fit(model, dataset_fn, epochs=epochs, steps_per_epoch=steps,
                           callbacks=callbacks, verbose=0)
    out = os.environ["ELASTIC_OUT"]
    from tfsyncmodes.exchange import CrossGroupPolicy
    policies = model.optimizer.exchange.find(CrossGroupPolicy)
    np.savez(os.path.join(out, f"rank{hvd.rank()}.npz"), *[np.asarray(w) for w in model.get_weights()],
             iterations=int(np.asarray(model.optimizer.iterations)), size=hvd.size(),
             groups=policies[0].num_groups if policies else -1,
             learning_rate=float(np.asarray(model.optimizer.learning_rate)),
             history=json.dumps({"epoch": history.epoch, **history.history}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
