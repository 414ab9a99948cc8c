"""Chief of a real PS cluster: applies one fresh and one forced-stale update and saves what
the test compares with NumPy. Runs under Keras 3 and under tf_keras (TF_USE_LEGACY_KERAS=1).

The forced-stale step reads the variables' version, then lets `bump` other updates land on
the parameter server (real increments of the applied-update counter) before it computes and
writes its own, so its staleness is exactly `bump`.
"""
import os
import sys

import numpy as np

from tests import reference


def main(outdir):
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.keras import compat
    from tfsyncmodes.keras.compat import keras

    strategy = tfsyncmodes.make_strategy("async")
    x, y = (a[0, 0] for a in reference.linear_data(1, 1))
    with strategy.scope():
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((reference.FEATURES,)), keras.layers.Dense(reference.OUTPUTS)])
        optimizer = tfsyncmodes.wrap(keras.optimizers.SGD(reference.LR), "async")
        optimizer.build(model.trainable_variables)
    # Per example, then the batch mean by hand: tf_keras refuses a reducing loss inside strategy.run.
    per_example = keras.losses.MeanSquaredError(reduction="none")

    # Keras 3's counter is a Keras variable around a tf.Variable; tf_keras' is the tf.Variable.
    counter = optimizer.iterations if compat.LEGACY else optimizer.iterations.value

    def replica_step(bump):
        read = optimizer.begin_step()
        with tf.control_dependencies([read]):
            landed = counter.assign_add(bump)
        with tf.control_dependencies([landed]):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(per_example(y, model(x)))
            grads = tape.gradient(loss, model.trainable_variables)
        if compat.LEGACY:
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        else:
            optimizer.apply(grads, model.trainable_variables)
        return optimizer.step_staleness

    @tf.function
    def step(bump):
        return strategy.run(replica_step, args=(bump,))

    weights = [np.concatenate([np.ravel(w) for w in model.get_weights()])]
    staleness = []
    for bump in (0, 3):
        staleness.append(int(strategy.coordinator.schedule(step, args=(tf.constant(bump, tf.int64),)).fetch()))
        weights.append(np.concatenate([np.ravel(w) for w in model.get_weights()]))
    kernel0, bias0 = (np.asarray(v) for v in model.get_weights())  # shapes for the test
    np.savez(os.path.join(outdir, "stale.npz"), w=np.stack(weights), staleness=np.array(staleness),
             iterations=int(np.asarray(optimizer.iterations)), x=x, y=y,
             kernel_shape=kernel0.shape, bias_shape=bias0.shape)


if __name__ == "__main__":
    main(sys.argv[1])
