"""A user's script that compiles with XLA on (``jit_compile=True``) under horovodrun: the
wrapper must turn XLA off (Horovod's ops have no XLA kernels) and train. Prints one JSON line
per rank with the device decision, whether XLA was turned off, and the final loss.

    horovodrun -np 2 python jit_user.py [--keep_xla]
"""
import json
import sys

import numpy as np

import tfsyncmodes
from tfsyncmodes.keras.compat import keras

strategy = tfsyncmodes.make_strategy("sync")
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=strategy.wrap(keras.optimizers.SGD(0.05)), loss="mse", jit_compile=True)
rng = np.random.default_rng(strategy.worker_index)
x = rng.normal(size=(64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
callbacks = strategy.callbacks()
if "--keep_xla" in sys.argv:  # the check without the guard: training must fail to compile
    callbacks = [c for c in callbacks if type(c).__name__ != "XlaOffForCollectives"]
history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=callbacks)
guard = [c for c in callbacks if type(c).__name__ == "XlaOffForCollectives"]
print("RESULT " + json.dumps({
    "rank": strategy.worker_index, "devices": strategy.device_plan.reason,
    "turned_off": bool(guard and guard[0].turned_off), "jit_compile": bool(model.jit_compile),
    "loss": history.history["loss"]}), flush=True)
