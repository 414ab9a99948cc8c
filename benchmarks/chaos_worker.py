"""The job a chaos run disturbs (``benchmarks.chaos``, ``tests/test_chaos.py``): a softmax
regression on the digits through ``strategy.fit``, in sync or hybrid (every rank of an elastic
``horovodrun``) or async (every task of ``python -m tfsyncmodes.launch``); the knobs come from
``TFSYNC_*``.

Each step also waits ``--step_ms`` in its input pipeline (TensorFlow's sleep dataset, standing
for a larger model's compute; it holds no core), and writes one line, after its update, to a
step log in ``--out``: ``BEGIN END ITERATIONS RANK SIZE`` (unix seconds of the step's start and
end, the optimizer's step count read after the update, the writer's rank, the world's size).
In sync and hybrid every rank writes ``steps-<pid>.log``, and ``rank-<pid>`` holds the rank and
size of each of its attempts (so that a chaos driver can pick a rank to kill); in async the
workers run the steps and append to ``steps-async.log``. The model counts the samples it
trained on in a variable of its own (sync: the sum over the world each step, by allreduce;
hybrid, which has no global collective in a step: the world's size times the per-rank batch),
which an elastic rollback restores with the rest of the state. The chief (rank 0) writes
``final.npz``: the weights, the step and sample counts."""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

CLASSES, PER_WORKER_BATCH = 10, 16
# Started warm: a child of tfsyncmodes_warm's server, TensorFlow imported before this line.
WARM = "tensorflow" in sys.modules and "--serve" in open(f"/proc/{os.getppid()}/cmdline").read().split("\0")


def digits():
    """(x_train, y_train, x_test, y_test): the digits, split as the example trainer splits them."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x, y = (data.data / 16.0).astype("float32"), data.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    split = len(x) * 4 // 5
    return x[order[:split]], y[order[:split]], x[order[split:]], y[order[split:]]


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for the step logs and final.npz")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps_per_epoch", type=int, default=100)
    parser.add_argument("--step_ms", type=float, default=50.0, help="emulated compute per step")
    parser.add_argument("--learning_rate", type=float, default=0.5)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras

    strategy = tfsyncmodes.make_strategy()  # a ps or worker task of async serves here and exits
    elastic = strategy.mode in ("sync", "hybrid")  # elastic horovodrun: every rank logs its steps
    if elastic:
        print(f"chaos_worker: started, warm: {WARM}", file=sys.stderr, flush=True)
        import horovod.tensorflow as hvd
    x, y, _, _ = digits()

    class Logged(keras.Sequential):
        """Counts its samples, and logs each step after its update."""

        def __init__(self, layers):
            super().__init__(layers)
            self.samples = self.add_weight(name="samples", shape=(), dtype="int64",
                                           initializer="zeros", trainable=False)

        def log_line(self, begin, rank, size):
            return tf.strings.join([
                tf.strings.as_string(begin, precision=4), tf.strings.as_string(tf.timestamp(), precision=4),
                tf.strings.as_string(self.optimizer.iterations), str(rank), str(size)], " ")

        def train_step(self, data):
            begin = tf.timestamp()
            with tf.control_dependencies([begin]):
                data = tf.nest.map_structure(tf.identity, data)
            if strategy.mode == "async":
                return self.async_step(data, begin)
            logs = super().train_step(data)
            batch = tf.cast(tf.shape(data[0])[0], tf.int64)
            rank, size = strategy.worker_index, strategy.num_workers  # as traced in this world
            if strategy.mode == "sync":  # the world's samples
                batch = hvd.allreduce(batch, op=hvd.Sum, name="chaos.samples")
            elif elastic:  # hybrid: no global collective in a step; every rank's batch is the same
                batch = batch * size
            raw_samples = self.samples.value if not callable(self.samples.value) else self.samples
            path = os.path.join(args.out, f"steps-{os.getpid()}.log" if elastic else "steps-async.log")
            with tf.control_dependencies(tf.nest.flatten(logs)):
                counted = raw_samples.assign_add(batch)  # the variable's own, atomic on a ps
                with tf.control_dependencies([counted]):
                    printed = tf.print(self.log_line(begin, rank, size), output_stream=f"file://{path}")
            with tf.control_dependencies([printed]):
                return tf.nest.map_structure(tf.identity, logs)

        def async_step(self, data, begin):
            """tf_keras' step written out, its writes made through strategy.one_unit: with
            --sync_exactly_once they land as one unit on the ps (the log line too,
            written there), so a lost worker's step is counted once."""
            features, labels = data
            with tf.GradientTape() as tape:
                predictions = self(features, training=True)
                # The compiled loss's value (its metric is updated with the writes).
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                    labels, predictions, from_logits=True))
            grads = tape.gradient(loss, self.trainable_variables)
            batch = tf.cast(tf.shape(features)[0], tf.int64)
            path = os.path.join(args.out, "steps-async.log")

            def writes(grads, labels, predictions, batch, begin):
                self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
                self.compiled_loss(labels, predictions)  # the loss metric, as tf_keras updates it
                logs = self.compute_metrics(None, labels, predictions, None)
                with tf.control_dependencies(tf.nest.flatten(logs)):
                    counted = self.samples.assign_add(batch)
                with tf.control_dependencies([counted]):
                    printed = tf.print(self.log_line(begin, strategy.worker_index, strategy.num_workers),
                                       output_stream=f"file://{path}")
                with tf.control_dependencies([printed]):
                    return tf.nest.map_structure(tf.identity, logs)

            return strategy.one_unit(writes, grads, labels, predictions, batch, begin)

    class Attempts(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            if elastic:  # each attempt of the elastic loop: this process's rank in the new world
                with open(os.path.join(args.out, f"rank-{os.getpid()}"), "w", encoding="utf-8") as handle:
                    handle.write(f"{strategy.worker_index} {strategy.num_workers}\n")

    def dataset_fn(context):
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        dataset = dataset.shuffle(len(x), seed=context.input_pipeline_id).repeat()
        dataset = dataset.batch(PER_WORKER_BATCH, drop_remainder=True)
        # tf.data's autotuning off: with it, dropping an attempt's iterator (a fit that ended
        # or failed) could block the rank for up to the autotuner's period (10-59 s seen), in
        # the iterator's destructor, while the others waited for it (fault-tolerance.md).
        options = tf.data.Options()
        options.autotune.enabled = False
        return dataset.apply(testing.sleep(int(args.step_ms * 1000))).with_options(options)

    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = Logged([keras.Input((x.shape[1],)), keras.layers.Dense(CLASSES)])
        model.compile(optimizer=strategy.wrap(keras.optimizers.SGD(args.learning_rate)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], jit_compile=False)
    strategy.fit(model, dataset_fn, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                 callbacks=[Attempts()], verbose=0)
    if strategy.is_chief:
        kernel, bias = (np.asarray(w) for w in model.layers[-1].get_weights())
        np.savez(os.path.join(args.out, "final.npz"), kernel=kernel, bias=bias,
                 iterations=int(np.asarray(model.optimizer.iterations)),
                 samples=int(np.asarray(model.samples)), size=strategy.num_workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
