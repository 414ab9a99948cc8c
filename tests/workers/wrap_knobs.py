"""Wraps two SGD optimizers, each given its own async knobs (clip_norm 0.5, then off), applies one
gradient with each, and prints the updated variables as JSON (Keras 3, or tf_keras with
TF_USE_LEGACY_KERAS=1)."""
import json

import numpy as np
import tensorflow as tf

import tfsyncmodes
from tfsyncmodes import config
from tfsyncmodes.keras.compat import LEGACY, keras


def knobs(clip_norm):
    return config.resolve({"mode": "async", "clip_norm": clip_norm, "staleness_aware_lr": False},
                          environ={}, use_flags=False)


clipped = tfsyncmodes.wrap(keras.optimizers.SGD(1.0), "async", config=knobs(0.5))
plain = tfsyncmodes.wrap(keras.optimizers.SGD(1.0), "async", config=knobs("off"))
grad = tf.constant([3.0, -4.0])
out = {}
for name, optimizer in (("clipped", clipped), ("plain", plain)):
    variable = tf.Variable(np.zeros(2, np.float32))
    if LEGACY:
        optimizer.apply_gradients([(grad, variable)])
    else:
        variable = keras.Variable(np.zeros(2, np.float32))
        optimizer.apply([grad], [variable])
    out[name] = np.asarray(variable).tolist()
out["class"] = type(clipped).__name__
print(json.dumps(out))
