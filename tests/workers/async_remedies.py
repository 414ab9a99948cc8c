"""Chief of a real PS cluster (2 workers, 1 ps) for tests/test_async_remedies.py: stale updates
under the SSP bound and DC-ASGD, saved as NumPy files. The knobs come from the environment
(TFSYNC_MAX_STALENESS, TFSYNC_DELAY_COMPENSATION); runs under Keras 3 and tf_keras.

    python -m tfsyncmodes.launch --workers 2 --ps 1 -- python async_remedies.py OUTDIR SCENARIO...

* ``schedule``: rounds of one *stale* step and k *fresh* steps, ordered through two variables
  on the parameter server. The stale step reads the variables and computes its gradient,
  raises ``gate`` to the round's number, and waits until the chief raises ``release``; the
  fresh steps (on the other worker, the stale one being busy) wait for ``gate``, then read,
  compute and write one by one; once all k have returned, the chief raises ``release`` and the
  stale step writes, k updates late. The stale step's whole update waits for the release:
  Keras' momentum update reads its slot with no dependency on the gradient, so without that
  the read could run before the wait and the write after, losing the fresh steps' velocity.
  The weights after every round are saved.
* ``fit``: the library's training loop (Keras 3: ``fit_loop`` with its ``CoordinatorRunner``,
  subclassed only to read its staleness tally at each epoch's end; tf_keras: ``strategy.fit``,
  i.e. ``model.fit``) for FIT_EPOCHS epochs with the cluster's ``--sync_slow_worker`` and
  ``max_staleness=0``; every update's staleness is saved (Keras 3: the runner's own tally on
  the parameter server; tf_keras: a histogram on the parameter server, added to with
  ``scatter_add``; each read at each epoch's end), with the History's ``dropped_updates``. The model carries a *probe*, a scalar
  whose loss term is ``probe`` itself: its gradient is exactly 1 whatever the weights, so with
  plain SGD at a learning rate of 2**-10 (and no remedy but the drop) every applied update
  moves it by exactly -2**-10 and a dropped one not at all; its value at each epoch's end is
  saved, a count of the applied updates read from the weights alone.
"""
import os
import sys

import numpy as np

from tests import reference

LR, MOMENTUM = 0.1, 0.5
ROUNDS = (0, 2, 1, 3, 2, 0, 4, 1)  # fresh updates landing while each stale step waits
FIT_EPOCHS, FIT_STEPS, FIT_FEATURES, FIT_BATCH, HIST, FIT_BOUND = 2, 60, 64, 512, 64, 0
# The fit scenario's steps are heavier (FIT_HIDDEN units at FIT_BATCH rows) than the slowed
# worker's running window (12.5 ms of every 50 ms, tfsyncmodes.faults.throttle_self), and there
# are 120 of them: with 30 light steps a run once had none stale (a slowed step fitted inside
# one running window), which the test needs some of; now 12 to 21 of 120 were, idle or loaded.
FIT_HIDDEN = 2048
FIT_LR = 2.0 ** -10  # exact in float32: the probe's value stays a whole number of steps


def flat_weights(model):
    return np.concatenate([np.ravel(np.asarray(w)) for w in model.get_weights()])


def schedule(strategy, outdir):
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.exchange.remedies import dropped_counter
    from tfsyncmodes.keras import compat
    from tfsyncmodes.keras.compat import keras

    steps = len(ROUNDS) + sum(ROUNDS)
    x, y = (a[:, 0] for a in reference.linear_data(steps, 1, seed=11))  # [steps, BATCH, ...]
    with strategy.scope():
        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.Input((reference.FEATURES,)), keras.layers.Dense(reference.OUTPUTS)])
        optimizer = tfsyncmodes.wrap(keras.optimizers.SGD(LR, momentum=MOMENTUM), "async")
        optimizer.build(model.trainable_variables)
        gate = tf.Variable(-1, dtype=tf.int64, trainable=False)
        release = tf.Variable(-1, dtype=tf.int64, trainable=False)
    per_example = keras.losses.MeanSquaredError(reduction="none")
    x_all, y_all = tf.constant(x), tf.constant(y)

    def gradients(index):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(per_example(tf.gather(y_all, index), model(tf.gather(x_all, index))))
        return tape.gradient(loss, model.trainable_variables)

    def apply(grads):
        if compat.LEGACY:
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        else:
            optimizer.apply(grads, model.trainable_variables)
        return optimizer.step_staleness

    def wait_until(variable, value):
        (polls,) = tf.while_loop(lambda i: variable.read_value() < value, lambda i: i + 1,
                                 [tf.constant(0, tf.int64)])
        return polls

    def stale_step(index, number):
        read = optimizer.begin_step()
        with tf.control_dependencies([read]):
            grads = gradients(index)
        with tf.control_dependencies(grads):
            opened = gate.assign(number, read_value=False)
        with tf.control_dependencies([opened]):
            waited = wait_until(release, number)
        # The write and every read it makes (the version, the weights, the momentum slot)
        # after the release: ops made in this block all wait for it.
        with tf.control_dependencies([waited]):
            return apply([tf.identity(g) for g in grads])

    def fresh_step(index, number):
        with tf.control_dependencies([wait_until(gate, number)]):
            read = optimizer.begin_step()
        with tf.control_dependencies([read]):
            grads = gradients(index)
        return apply(grads)

    stale_fn = tf.function(lambda i, n: strategy.run(stale_step, args=(i, n)))
    fresh_fn = tf.function(lambda i, n: strategy.run(fresh_step, args=(i, n)))
    coordinator = strategy.coordinator
    weights, staleness = [flat_weights(model)], []
    index = 0
    for number, fresh in enumerate(ROUNDS):
        number = tf.constant(number, tf.int64)
        stale = coordinator.schedule(stale_fn, args=(tf.constant(index, tf.int64), number))
        index += 1
        others = []
        for _ in range(fresh):
            others.append(coordinator.schedule(fresh_fn, args=(tf.constant(index, tf.int64), number)))
            index += 1
        fresh_staleness = [int(np.asarray(r.fetch())) for r in others]
        release.assign(number)
        staleness.append((int(np.asarray(stale.fetch())), fresh_staleness))
        weights.append(flat_weights(model))
    kernel, bias = (np.asarray(w) for w in model.get_weights())
    np.savez(os.path.join(outdir, "schedule.npz"), x=x, y=y, w=np.stack(weights), rounds=np.array(ROUNDS),
             stale_staleness=np.array([s for s, _ in staleness]),
             fresh_staleness=np.array([f for _, fs in staleness for f in fs], dtype=np.int64),
             dropped=int(np.asarray(dropped_counter(optimizer))),
             iterations=int(np.asarray(optimizer.iterations)), kernel_shape=kernel.shape,
             lr=LR, momentum=MOMENTUM)


def fit(strategy, outdir):
    import tensorflow as tf

    import tfsyncmodes
    import tfsyncmodes.config
    from tfsyncmodes.keras import compat
    from tfsyncmodes.keras.compat import keras

    rng = np.random.default_rng(4)
    x = rng.standard_normal((FIT_BATCH * 4, FIT_FEATURES)).astype("float32")
    y = rng.standard_normal((FIT_BATCH * 4, 8)).astype("float32")

    def dataset_fn(context):
        del context
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(FIT_BATCH)

    with strategy.scope():
        histogram = tf.Variable(tf.zeros([HIST], tf.int64), trainable=False)

    class Probe(keras.layers.Layer):
        """Passes its input on; adds ``probe`` (initially 0) to the loss, so d loss / d probe = 1."""

        def build(self, input_shape):
            self.probe = self.add_weight(name="probe", shape=(), initializer="zeros")

        def call(self, inputs):
            self.add_loss(1.0 * self.probe)
            return inputs

    class Recorded(keras.Sequential):
        """tf_keras: each update's staleness into a histogram on the parameter server."""

        def train_step(self, data):
            logs = super().train_step(data)
            bucket = tf.reshape(tf.minimum(tf.cast(self.optimizer.step_staleness, tf.int64), HIST - 1), [1])
            histogram.scatter_add(tf.IndexedSlices(tf.ones([1], tf.int64), bucket))
            return logs

    with strategy.scope():
        keras.utils.set_random_seed(3)
        probe = Probe()
        layers = [keras.Input((FIT_FEATURES,)), probe, keras.layers.Dense(FIT_HIDDEN, activation="relu"),
                  keras.layers.Dense(8)]
        model = Recorded(layers) if compat.LEGACY else keras.Sequential(layers)
        # Bound 0 here: every update another one overtook is dropped. The drop is the only
        # remedy (the cluster's delay compensation and the default 1/(1+s) off), so an applied
        # update moves the probe by exactly the learning rate.
        knobs = tfsyncmodes.config.resolve({"mode": "async", "max_staleness": FIT_BOUND,
                                            "delay_compensation": "off", "staleness_aware_lr": False},
                                           use_flags=False)
        model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.SGD(FIT_LR), config=knobs), loss="mse")

    per_epoch, probe_values = [], [np.float32(np.asarray(probe.probe))]
    if compat.LEGACY:
        class AtEpochEnd(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                per_epoch.append(np.asarray(histogram.read_value()))
                probe_values.append(np.float32(np.asarray(probe.probe)))

        history = strategy.fit(model, dataset_fn, epochs=FIT_EPOCHS, steps_per_epoch=FIT_STEPS,
                               callbacks=[AtEpochEnd()], verbose=0)
        counts = np.diff(np.stack([np.zeros(HIST, np.int64)] + per_epoch), axis=0)
    else:
        from tfsyncmodes.keras.async_runner import CoordinatorRunner
        from tfsyncmodes.keras.loop import fit_loop

        class Recording(CoordinatorRunner):
            """The loop's own runner; keeps its staleness tally's counts at each epoch's end."""

            def epoch_logs(self, last_step_logs):
                logs = super().epoch_logs(last_step_logs)
                tallied = np.asarray(tf.convert_to_tensor(self._tally.variable))[:self._tally.buckets]
                per_epoch.append(np.concatenate([tallied[:HIST - 1], [tallied[HIST - 1:].sum()]]))
                probe_values.append(np.float32(np.asarray(probe.probe)))
                return logs

        history = fit_loop(model, Recording(strategy, dataset_fn), epochs=FIT_EPOCHS,
                           steps_per_epoch=FIT_STEPS, verbose=0)
        counts = np.diff(np.stack([np.zeros(HIST, np.int64)] + per_epoch), axis=0)
    np.savez(os.path.join(outdir, "fit.npz"), counts=counts,
             dropped=np.array(history.history["dropped_updates"]),
             iterations=int(np.asarray(model.optimizer.iterations)), steps=FIT_EPOCHS * FIT_STEPS,
             bound=FIT_BOUND, steps_per_epoch=FIT_STEPS, probe=np.array(probe_values, np.float32), lr=FIT_LR)


def main(outdir, scenarios):
    import tfsyncmodes

    strategy = tfsyncmodes.make_strategy("async")
    if "schedule" in scenarios:
        schedule(strategy, outdir)
    if "fit" in scenarios:
        fit(strategy, outdir)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
