"""Hybrid training interrupted by model.save and resumed from load_model in a fresh job.

    horovodrun -np 4 python hybrid_resume.py OUTDIR train    # 3 steps, save, then 1 more step
    horovodrun -np 4 python hybrid_resume.py OUTDIR resume   # load, then the same 1 more step

Knobs come from the environment (groups of 2, Top-K with error feedback, periodic). The chief
saves, as a checkpoint would; every rank loads the chief's file. Saves per rank what the test
compares: the weights after the extra step, and the optimizer's variables by name.
"""
import os
import sys

import numpy as np

from tests import reference

STEPS = 3


def main(outdir, phase):
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras

    strategy = tfsyncmodes.make_strategy("hybrid")
    rank, replicas = strategy.worker_index, strategy.num_replicas_in_sync
    x, y = reference.linear_data(STEPS + 1, replicas)

    def steps(first, last):
        return lambda context: tf.data.Dataset.from_tensor_slices(
            (x[first:last, rank], y[first:last, rank])).unbatch().batch(reference.BATCH)

    def state(model):
        return {f"opt.{v.name}.{i}": np.array(v) for i, v in enumerate(model.optimizer.variables)}

    path = os.path.join(outdir, "model.keras")
    with strategy.scope():
        if phase == "train":
            keras.utils.set_random_seed(100 + rank)
            model = keras.Sequential([keras.Input((reference.FEATURES,)), keras.layers.Dense(reference.OUTPUTS)])
            model.compile(optimizer=strategy.wrap(keras.optimizers.SGD(reference.LR)), loss="mse",
                          jit_compile=False)
        else:
            model = keras.models.load_model(path)
    if phase == "train":
        strategy.fit(model, steps(0, STEPS), epochs=1, steps_per_epoch=STEPS, verbose=0)
        if strategy.is_chief:
            model.save(path)
            np.savez(os.path.join(outdir, "saved.npz"), **state(model))
        strategy.hvd.allreduce(tf.constant(0.0), name="test.saved")  # every rank waits for the file
    loaded = state(model)
    strategy.fit(model, steps(STEPS, STEPS + 1), epochs=1, steps_per_epoch=1, verbose=0)
    np.savez(os.path.join(outdir, f"{phase}.rank{rank}.npz"), *[np.array(w) for w in model.get_weights()],
             iterations=int(np.asarray(model.optimizer.iterations)), **loaded)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
