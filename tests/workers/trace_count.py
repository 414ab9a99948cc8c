"""Under horovodrun: how many times a compiled model's train step is traced when it trains
through ``strategy.fit`` (the mode's strategy) and when the script calls ``model.fit`` itself
with the wrapped optimizer, each for 2 epochs. A trace runs the step's Python once; a model
whose compiled metrics were made inside the first trace is traced twice (tf.function traces a
function again when its first trace created variables). Prints one JSON line per rank.

    horovodrun -np 2 python trace_count.py MODE
"""
import json
import sys

import numpy as np
import tensorflow as tf

import tfsyncmodes
from tfsyncmodes.keras.compat import keras

mode = sys.argv[1]
strategy = tfsyncmodes.make_strategy(mode)
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype(np.float32)
y = (x.sum(axis=1) > 0).astype(np.int64)


class Counted(keras.Sequential):
    traces = 0

    def train_step(self, data):
        Counted.traces += 1  # Python: runs once per trace
        return super().train_step(data)


def compiled():
    with strategy.scope():
        model = Counted([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                         keras.layers.Dense(2)])
        model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.SGD(0.1)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model


def dataset_fn(context):
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shard(context.num_input_pipelines,
                                                              context.input_pipeline_id)
    return dataset.repeat().batch(context.get_per_replica_batch_size(16), drop_remainder=True)


traces = {}
Counted.traces = 0
strategy.fit(compiled(), dataset_fn, epochs=2, steps_per_epoch=2, verbose=0)
traces["strategy_fit"] = Counted.traces
# The script's own model.fit on the rank's dataset (Keras makes the metrics in the first trace).
Counted.traces = 0
compiled().fit(strategy.distribute_datasets_from_function(dataset_fn), epochs=2, steps_per_epoch=2,
               verbose=0, callbacks=strategy.callbacks())
traces["model_fit"] = Counted.traces
print("RESULT " + json.dumps({"rank": strategy.worker_index, "traces": traces}), flush=True)
