"""A Horovod user's script that wraps its optimizer with tfsyncmodes.wrap() but never makes a
strategy (so nothing starts Horovod), run through tfsyncmodes.run: under horovodrun with 2 or
more ranks it must stop with one line, not train each rank alone.

    horovodrun -np 2 python wrap_without_strategy.py --sync_mode=sync
"""
import numpy as np

import tfsyncmodes
from tfsyncmodes.keras.compat import keras


def main(argv):
    del argv
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.SGD(0.1)), loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(32, 4)), rng.normal(size=(32, 2)), epochs=1, verbose=0)
    print("TRAINED", flush=True)


if __name__ == "__main__":
    tfsyncmodes.run(main)
