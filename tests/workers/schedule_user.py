"""A user's own script (not scripts/train.py): a model, the strategy's wrapper and callbacks,
``strategy.fit`` with the run's whole epochs. Run through the launcher with
``--sync_mode_schedule=sync:1e,async:1e,sync`` it trains one phase per process layout; each phase's
chief prints one JSON line.

    python -m tfsyncmodes.launch --np 2 --workers 1 --ps 1 -- python schedule_user.py MODEL_DIR
"""
import json
import sys

import numpy as np
import tensorflow as tf

import tfsyncmodes
from tfsyncmodes.keras.compat import keras

model_dir = sys.argv[1]
strategy = tfsyncmodes.make_strategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")


def dataset_fn(context):
    data = tf.data.Dataset.from_tensor_slices((x, y)).shard(context.num_input_pipelines,
                                                          context.input_pipeline_id)
    return data.repeat().batch(context.get_per_replica_batch_size(32), drop_remainder=True)


with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer=strategy.wrap(keras.optimizers.SGD(0.05, momentum=0.5)), loss="mse")
history = strategy.fit(model, dataset_fn, epochs=3, steps_per_epoch=8, callbacks=strategy.callbacks(model_dir))
if strategy.is_chief:
    print("RESULT " + json.dumps({"mode": strategy.mode, "epochs": [int(e) for e in history.epoch],
                                  "steps": int(np.asarray(model.optimizer.iterations)),
                                  "loss": history.history["loss"]}), flush=True)
