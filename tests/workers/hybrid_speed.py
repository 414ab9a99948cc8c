"""Steps per second of every rank, sync vs hybrid, in one horovodrun job with a straggler.

    TFSYNC_SLOW_WORKER=1:4.0 horovodrun -np 4 python hybrid_speed.py OUT.json [--steps=N]

Trains the same MLP twice on the same data: through ``wrap(opt, "sync")`` (one allreduce over
all ranks per step) and through ``wrap(opt, "hybrid")`` with the run's hybrid settings. The
mode's required callbacks include the ``--slow_worker`` straggler. Each rank records when its
training began and when its last step ended; rank 0 writes every rank's steps per second.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv):
    import argparse

    import numpy as np

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)

    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras

    strategy = tfsyncmodes.make_strategy("hybrid")
    hvd = strategy.hvd
    rng = np.random.default_rng(strategy.worker_index)
    x = rng.standard_normal((64 * 8, 64)).astype("float32")
    y = rng.integers(0, 10, len(x)).astype("int32")

    class StepClock(keras.callbacks.Callback):
        """Times steps 1..N-1 (step 0 may still build things)."""

        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                self.began = time.perf_counter()
            self.last = time.perf_counter()

    rates = {}
    for mode in ("sync", "hybrid"):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.Adam(1e-3), mode),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
        clock = StepClock()
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64)
        required = strategy.required_callbacks()
        # Warm-up (tracing) without the straggler, whose sleep is proportional to the step.
        model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0,
                  callbacks=[c for c in required if type(c).__name__ != "SlowWorker"])
        model.fit(dataset, epochs=1, steps_per_epoch=args.steps, verbose=0,
                  callbacks=required + [clock])
        rate = (args.steps - 1) / (clock.last - clock.began)
        rates[mode] = [float(r) for r in hvd.allgather(tf.constant([rate]), name=f"rates.{mode}").numpy()]
    if hvd.rank() == 0:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump({"steps_per_second": rates, "groups": [list(g) for g in strategy.layout.groups],
                       "staleness": strategy.config.staleness, "steps": args.steps}, handle)


if __name__ == "__main__":
    main(sys.argv[1:])
