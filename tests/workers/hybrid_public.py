"""Trains a linear model in hybrid mode through the public API only, once per scenario, and
saves each rank's start and end weights.

    horovodrun -np 4 python hybrid_public.py OUTDIR SCENARIOS_JSON [--steps=N] [--optimizer=sgd|adam]

SCENARIOS_JSON maps a scenario name to the hybrid knobs given in code (``tfsyncmodes.resolve``,
then ``tfsyncmodes.wrap(optimizer, config=...)`` in the strategy's scope), and optionally its
"optimizer"; the groups come from the environment (TFSYNC_GROUP_SIZE). Every rank gets its own
rows of a dataset every process can rebuild from the seed and starts from its own weights.
Saves OUTDIR/<name>.rank<R>.npz.
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
    parser.add_argument("scenarios")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--optimizer", default="sgd")
    args = parser.parse_args(argv)

    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras

    environ = {k: v for k, v in os.environ.items() if k.startswith("TFSYNC_")}
    strategy = tfsyncmodes.make_strategy("hybrid", config=tfsyncmodes.resolve(
        {"mode": "hybrid"}, use_flags=False, environ=environ))
    rank = strategy.worker_index
    x, y = reference.linear_data(args.steps, strategy.num_replicas_in_sync)

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((x[:, rank], y[:, rank])).unbatch().batch(reference.BATCH)

    for name, knobs in json.loads(args.scenarios).items():
        knobs = dict(knobs)
        optimizer = knobs.pop("optimizer", args.optimizer)
        config = tfsyncmodes.resolve(dict(knobs, mode="hybrid"), use_flags=False, environ=environ)
        with strategy.scope():
            keras.utils.set_random_seed(100 + rank)
            model = keras.Sequential([keras.Input((reference.FEATURES,)), keras.layers.Dense(reference.OUTPUTS)])
            initial = [np.array(w) for w in model.get_weights()]
            inner = (keras.optimizers.SGD(reference.LR) if optimizer == "sgd"
                     else keras.optimizers.Adam(reference.LR))
            model.compile(optimizer=tfsyncmodes.wrap(inner, config=config), loss="mse", jit_compile=False)
        strategy.fit(model, dataset_fn, epochs=1, steps_per_epoch=args.steps, verbose=0)
        final = model.get_weights()
        np.savez(os.path.join(args.outdir, f"{name}.rank{rank}.npz"), kernel0=initial[0], bias0=initial[1],
                 kernel=final[0], bias=final[1], iterations=int(np.asarray(model.optimizer.iterations)),
                 groups=np.array(strategy.layout.groups), group=strategy.group_index)


if __name__ == "__main__":
    main(sys.argv[1:])
