"""strategy.reduce under horovodrun: each rank contributes rank + 1; prints SUM and MEAN."""
import json

import tensorflow as tf

import tfsyncmodes

strategy = tfsyncmodes.make_strategy("sync")
value = tf.constant(float(strategy.worker_index + 1))
total = strategy.reduce(tf.distribute.ReduceOp.SUM, value)
mean = strategy.reduce(tf.distribute.ReduceOp.MEAN, value)
print("RESULT " + json.dumps({"rank": strategy.worker_index, "sum": float(total), "mean": float(mean)}), flush=True)
