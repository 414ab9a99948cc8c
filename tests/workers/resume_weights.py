"""A ``scripts/train.py --model`` hook for the resume tests: the same MLP as train.py's, and,
when the process exits normally, this process's final weights written to
``$RESUME_WEIGHTS_DIR/<task>.npz`` (task: the Horovod rank, or the TF_CONFIG task), so the test
can compare every rank's weights after the run."""
import atexit
import json
import os

import numpy as np


def _task_name():
    if "HOROVOD_RANK" in os.environ:
        return f"rank{os.environ['HOROVOD_RANK']}"
    if os.environ.get("TF_CONFIG"):
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        return f"{task['type']}{task['index']}"
    return "single"


def build(num_features, num_classes):
    from tfsyncmodes.keras.compat import keras

    model = keras.Sequential([
        keras.Input((num_features,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(num_classes),
    ])
    out = os.environ.get("RESUME_WEIGHTS_DIR")
    if out:
        def dump():
            os.makedirs(out, exist_ok=True)
            np.savez(os.path.join(out, f"{_task_name()}.npz"), *[np.asarray(w) for w in model.get_weights()])

        atexit.register(dump)
    return model
