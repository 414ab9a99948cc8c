"""Under horovodrun: the batches a rank gets from the strategy's two dataset methods, with no
options, with ``tf.distribute.InputOptions`` (which place a worker's replicas' batches, so
apply to no rank) and with ``tf.data.Options``. Prints one JSON line per rank.

    horovodrun -np 2 python horovod_datasets.py
"""
import json

import numpy as np
import tensorflow as tf

import tfsyncmodes

strategy = tfsyncmodes.make_strategy("sync")
rows = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
deterministic = tf.data.Options()
deterministic.deterministic = True
choices = {"none": None, "input_options": tf.distribute.InputOptions(experimental_per_replica_buffer_size=0),
           "data_options": deterministic}


def from_function(context):
    dataset = tf.data.Dataset.from_tensor_slices(rows).shard(context.num_input_pipelines, context.input_pipeline_id)
    return dataset.batch(context.get_per_replica_batch_size(4), drop_remainder=True)


seen = {}
for name, options in choices.items():
    split = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(rows).batch(4, drop_remainder=True),
                                                     options)
    made = strategy.distribute_datasets_from_function(from_function, options)
    seen[name] = {"distribute_dataset": [np.asarray(b).tolist() for b in split],
                  "from_function": [np.asarray(b).tolist() for b in made],
                  "data_options_kept": made.options().deterministic is True}
print("RESULT " + json.dumps({"rank": strategy.worker_index, "size": strategy.num_workers, "seen": seen}), flush=True)
