"""Chief of a real PS cluster: trains a small MLP with ``strategy.fit`` and saves where each of
its variables lives (``--sync_ps_shards`` / ``TFSYNC_PS_SHARDS`` and ``TFSYNC_MIN_SHARD_BYTES``
come from the environment).

    python -m tfsyncmodes.launch --workers 1 --ps 2 -- python async_placement.py OUTDIR

Saves OUTDIR/placement.json: per model variable, its full shape and its parts (shape, device);
and the optimizer's step count.
"""
import json
import os
import sys

import numpy as np

FEATURES, HIDDEN, CLASSES, BATCH, STEPS, EPOCHS = 64, 128, 10, 16, 4, 2


def parts_of(variable):
    """(shape, device) of each piece of `variable`: one for a whole variable, one per shard."""
    pieces = getattr(variable, "variables", None)  # tf ShardedVariable (tf_keras + partitioner)
    if pieces is None:
        value = getattr(variable, "value", None)  # a Keras 3 variable wraps a tf.Variable
        pieces = [variable if value is None or callable(value) else value]
    return [{"shape": list(p.shape), "device": p.device} for p in pieces]


def main(outdir):
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras

    strategy = tfsyncmodes.make_strategy("async")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH * STEPS, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, BATCH * STEPS).astype("int32")

    def dataset_fn(context):
        del context
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)

    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                                  keras.layers.Dense(CLASSES)])
        model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.SGD(0.05), "async"), jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [np.array(w) for w in model.get_weights()]
    strategy.fit(model, dataset_fn, epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
    after = model.get_weights()
    placement = {
        "variables": [{"name": getattr(v, "path", v.name), "shape": list(v.shape), "parts": parts_of(v)} for v in model.weights],
        "changed": [bool(np.abs(a - b).max() > 0) for a, b in zip(after, before)],
        "iterations": int(np.asarray(model.optimizer.iterations)), "expected_steps": EPOCHS * STEPS,
    }
    with open(os.path.join(outdir, "placement.json"), "w", encoding="utf-8") as handle:
        json.dump(placement, handle, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
