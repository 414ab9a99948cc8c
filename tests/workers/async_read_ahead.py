"""Chief of a real PS cluster (2 workers): how many batches each worker's input pipeline made
in one epoch of STEPS steps of ``strategy.fit``, with tf.distribute's default input options and
with the ones the example trainer's emulated compute uses. Every batch a worker's pipeline makes
writes an empty file named for its worker and its index, so the batches are counted where they
were made; the counts are saved as JSON once the workers have had a second to read ahead.

    python -m tfsyncmodes.launch --workers 2 --ps 1 -- python async_read_ahead.py OUTDIR
"""
import json
import os
import sys
import time

import numpy as np

FEATURES, CLASSES, BATCH, STEPS = 8, 4, 16, 12


def main(outdir):
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.examples import emulated_compute
    from tfsyncmodes.keras.compat import keras

    strategy = tfsyncmodes.make_strategy("async")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, BATCH).astype("int32")

    def dataset_fn_writing_to(folder):
        def dataset_fn(context):
            del context
            try:  # traced for a worker; the chief's own sample batch is -1
                worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            except RuntimeError:
                worker = -1

            def made(index):
                name = tf.strings.format(folder + "/worker{}-batch{}", (worker, index))
                with tf.control_dependencies([tf.io.write_file(name, "")]):
                    return tf.identity(x), tf.identity(y)

            options = tf.data.Options()  # no prefetch of tf.data's own: only tf.distribute's
            options.experimental_optimization.inject_prefetch = False
            return tf.data.Dataset.counter().map(made).with_options(options)
        return dataset_fn

    counts = {}
    for name, options in (("default", None), ("emulated_compute", emulated_compute.input_options(True))):
        folder = os.path.join(outdir, name)
        os.makedirs(folder)
        with strategy.scope():
            model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)])
            model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.SGD(0.01), "async"), jit_compile=False,
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        strategy.fit(model, dataset_fn_writing_to(folder), epochs=1, steps_per_epoch=STEPS, verbose=0,
                     input_options=options)
        steps = int(np.asarray(model.optimizer.iterations))

        def made():
            return len([f for f in os.listdir(folder) if not f.startswith("worker-1-")])

        # A worker that reads ahead has done so within seconds (up to 30 on a loaded machine);
        # one that reads no batch ahead makes none in a pause of a second either.
        deadline = time.monotonic() + (30.0 if options is None else 1.0)
        while time.monotonic() < deadline and not (options is None and made() > steps):
            time.sleep(0.05)
        counts[name] = {"made": made(), "steps": steps}
    with open(os.path.join(outdir, "counts.json"), "w") as out:
        json.dump(counts, out)


if __name__ == "__main__":
    main(sys.argv[1])
