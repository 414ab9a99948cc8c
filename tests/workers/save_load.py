"""Trains a wrapped model a few steps, saves it with model.save, loads it back, and records
what the test compares."""
import json
import os
import sys


def main(outdir):
    import numpy as np

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras

    keras.utils.set_random_seed(3)
    x = np.random.default_rng(0).standard_normal((32, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.Adam(0.005), "sync"),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    path = os.path.join(outdir, "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)

    def describe(m):
        opt = m.optimizer
        inner = getattr(opt, "inner_optimizer", opt)
        return {
            "class": type(opt).__name__,
            "inner_class": type(inner).__name__,
            "mode": getattr(opt, "mode", getattr(opt, "sync_mode", None)),
            "learning_rate": float(np.asarray(opt.learning_rate)),
            "iterations": int(np.asarray(opt.iterations)),
        }

    np.savez(os.path.join(outdir, "state.npz"),
             saved_opt=np.concatenate([np.ravel(v) for v in model.optimizer.variables]),
             loaded_opt=np.concatenate([np.ravel(v) for v in loaded.optimizer.variables]),
             saved_pred=np.asarray(model(x)), loaded_pred=np.asarray(loaded(x)))
    described = {"saved": describe(model), "loaded": describe(loaded)}
    # One more step from both must give the same weights: the optimizer state survived.
    model.fit(x[:8], y[:8], batch_size=8, epochs=1, verbose=0)
    loaded.fit(x[:8], y[:8], batch_size=8, epochs=1, verbose=0)
    np.savez(os.path.join(outdir, "after.npz"),
             saved=np.concatenate([np.ravel(w) for w in model.get_weights()]),
             loaded=np.concatenate([np.ravel(w) for w in loaded.get_weights()]))
    with open(os.path.join(outdir, "describe.json"), "w") as handle:
        json.dump(described, handle)


if __name__ == "__main__":
    main(sys.argv[1])
