"""Chief of a real PS cluster (2 workers): what the async tests check, saved as NumPy files.

    python -m tfsyncmodes.launch --workers 2 --ps 1 -- python async_checks.py OUTDIR SCENARIO...

Scenarios (each with a model of its own, in the same cluster):

* ``counter``: schedules STEPS updates of the wrapped optimizer straight on the coordinator
  (no training loop to correct the count afterwards) and saves the parameter-server copy of
  ``optimizer.iterations``, and which worker ran each step (with ``--sync_slow_worker``, one of
  them runs slowed down).
* ``metrics``: one epoch of ``strategy.fit`` with the learning rate 0, every batch the same
  BATCH examples, so every step's predictions are those of the saved weights: the test
  recomputes accuracy and loss in NumPy and knows how many examples were counted.
* ``early_stopping``: ``strategy.fit`` for 10 epochs with an ``EarlyStopping`` that can never
  see an improvement (patience 1): the History must end after 2 epochs.
* ``lost_after_update``: ``strategy.fit`` (2 x ONCE_STEPS steps, plain SGD) of a model whose
  loss is linear in its weights, so every step's gradient is the same whichever weights it
  read and the final kernel says how many updates landed. The worker running step
  ABORT_AT aborts (``tf.raw_ops.Abort``, the process dies with SIGABRT) once that step's update
  is on the parameter server and before it reports: the coordinator runs the step again on the
  other worker. Saves the kernel, the counts and the re-runs found applied.
* ``lost_sending`` (with ``--sync_exactly_once``): the same fit, but the worker running
  step ABORT_AT aborts once its gradient is on the parameter server, before the rest of the
  values its step's writes need leave it (they wait for the abort): the step's writes must
  not have begun.
* ``lost_writing`` (with ``--sync_exactly_once``): the same fit, but the worker running step
  ABORT_AT aborts while the parameter server is between that step's update and its mark
  (async_writing.py): the server must finish the unit, and the re-run skip it.
* ``lost_writing_counted``: ``lost_writing`` with counters on the server that the lost step's
  unit bumps after its update, after each stretch of work and after its mark (saved as
  ``counted``).
"""
import os
import sys

import numpy as np

FEATURES, CLASSES, BATCH, STEPS = 8, 4, 32, 200
ONCE_STEPS, ONCE_LR, ABORT_AT = 40, 0.01, 60  # steps per epoch (2 epochs), rate, the lost step (epoch 2)


def data(seed=3):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((BATCH, FEATURES)).astype("float32"),
            rng.integers(0, CLASSES, BATCH).astype("int32"))


def main(outdir, scenarios):
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras

    strategy = tfsyncmodes.make_strategy("async")
    x, y = data()

    def dataset_fn(context):
        del context  # every batch is the whole set
        return tf.data.Dataset.from_tensors((x, y)).repeat()

    def model_and_optimizer(learning_rate, seed):
        with strategy.scope():
            keras.utils.set_random_seed(seed)
            model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)])
            optimizer = tfsyncmodes.wrap(keras.optimizers.SGD(learning_rate), "async")
            model.compile(optimizer=optimizer, jit_compile=False, metrics=["accuracy"],
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model, model.optimizer

    if "counter" in scenarios:
        model, optimizer = model_and_optimizer(0.01, 1)
        optimizer.build(model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def replica_step(features, labels):
            read = optimizer.begin_step()
            with tf.control_dependencies([read]):
                with tf.GradientTape() as tape:
                    loss = loss_fn(labels, model(features, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return tf.distribute.coordinator.experimental_get_current_worker_index()

        @tf.function
        def step(iterator):
            return strategy.run(replica_step, args=next(iterator))

        iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
        remotes = [strategy.coordinator.schedule(step, args=(iterator,)) for _ in range(STEPS)]
        strategy.coordinator.join()
        workers = np.array([int(np.asarray(r.fetch())) for r in remotes])
        np.savez(os.path.join(outdir, "counter.npz"), iterations=int(np.asarray(optimizer.iterations)),
                 scheduled=STEPS, workers=workers)

    if "metrics" in scenarios:
        model, optimizer = model_and_optimizer(0.0, 2)
        history = strategy.fit(model, dataset_fn, epochs=1, steps_per_epoch=STEPS, verbose=0)
        # Keras 3 flattens compiled metrics into the model's; tf_keras lists them per metric.
        metrics = [leaf for m in model.metrics for leaf in (getattr(m, "metrics", None) or [m])]
        variables = {f"{m.name}/{v.name.split('/')[-1].split(':')[0]}": float(np.asarray(v))
                     for m in metrics for v in m.variables}
        kernel, bias = (np.asarray(w) for w in model.get_weights())
        np.savez(os.path.join(outdir, "metrics.npz"), x=x, y=y, kernel=kernel, bias=bias,
                 accuracy=history.history["accuracy"][-1], loss=history.history["loss"][-1],
                 steps=STEPS, batch=BATCH, variable_paths=np.array(list(variables)),
                 variable_values=np.array(list(variables.values())),
                 iterations=int(np.asarray(optimizer.iterations)))

    if "early_stopping" in scenarios:
        model, optimizer = model_and_optimizer(0.01, 3)
        stop = keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=1e9)
        history = strategy.fit(model, dataset_fn, epochs=10, steps_per_epoch=5, callbacks=[stop], verbose=0)
        np.savez(os.path.join(outdir, "early_stopping.npz"), epochs=len(history.history["loss"]),
                 iterations=int(np.asarray(optimizer.iterations)), steps_per_epoch=5)

    for name in ("lost_after_update", "lost_sending", "lost_writing", "lost_writing_counted"):
        if name in scenarios:
            linear_fit(outdir, strategy, keras, dataset_fn, name)


def abort_after(step_id_to_lose, fired, claims):
    """Wraps AppliedSteps.run (and AtLeastOnce.run): after the step with that id has run (update
    landed, step marked), its worker aborts, once in the run (`fired`, on the parameter server).
    With --sync_exactly_once=false every step id is 0, so the first step's worker aborts.
    Two workers can reach that step at once: `claims` (an atomic increment on the parameter
    server) lets only the first abort."""
    import tensorflow as tf

    from tfsyncmodes.keras import once

    originals = {kind: kind.run for kind in (once.AppliedSteps, once.AtLeastOnce)}

    def run(self, step_id, step, written, **kwargs):
        outputs = originals[type(self)](self, step_id, step, written, **kwargs)

        def abort():
            with tf.control_dependencies([fired.assign(1)]):
                aborted = tf.raw_ops.Abort(error_msg=f"lost after step {step_id_to_lose}'s update")
            with tf.control_dependencies([aborted]):
                return tf.constant(0)

        def claim():
            first = tf.equal(claims.assign_add(1), 1)
            return tf.cond(first, abort, lambda: tf.constant(0))

        with tf.control_dependencies(tf.nest.flatten(outputs)):
            lose = tf.logical_and(tf.equal(step_id, step_id_to_lose), tf.equal(fired.read_value(), 0))
            done = tf.cond(lose, claim, lambda: tf.constant(0))
        with tf.control_dependencies([done]):
            return tf.nest.map_structure(tf.identity, outputs)

    once.AppliedSteps.run = once.AtLeastOnce.run = run


def abort_once(step_id_to_lose, fired, claims, message, after=(), note=None):
    """An op that aborts this worker if it runs step `step_id_to_lose` and is the first to
    (once the ops in `after` have run); `note`, when given, is a file the worker writes the
    time to just before (on its own device: nothing between it and the abort waits on another)."""
    import tensorflow as tf

    def abort():
        before = [fired.assign(1), *after]
        if note is not None:
            with tf.control_dependencies(before):
                before = [tf.io.write_file(note, tf.strings.as_string(tf.timestamp(), precision=6))]
        with tf.control_dependencies(before):
            aborted = tf.raw_ops.Abort(error_msg=message)
        # Abort is not stateful: a stateful op after it keeps it when nothing waits for the cond.
        with tf.control_dependencies([aborted]):
            claims.assign_add(0, read_value=False)
            return tf.constant(0)

    def claim():
        return tf.cond(tf.equal(claims.assign_add(1), 1), abort, lambda: tf.constant(0))

    step_id = tracing_step_id()
    lose = tf.logical_and(tf.equal(step_id, step_id_to_lose), tf.equal(fired.read_value(), 0))
    return tf.cond(lose, claim, lambda: tf.constant(0))


def tracing_step_id():
    from tfsyncmodes.keras import once
    return once.AppliedSteps._traced_step_id


def record_traced_step_ids():
    """Wraps AppliedSteps.run so that tracing_step_id() gives the id of the step being traced."""
    from tfsyncmodes.keras import once

    run = once.AppliedSteps.run

    def traced_run(self, step_id, *args, **kwargs):
        once.AppliedSteps._traced_step_id = step_id
        return run(self, step_id, *args, **kwargs)

    once.AppliedSteps.run = traced_run


def abort_while_sending(step_id_to_lose, fired, claims):
    """Wraps AppliedSteps.on_ps (and run, to know which step is traced): the worker of step
    `step_id_to_lose` aborts once its gradients are on the parameter server, the rest of the
    unit's values waiting for the abort."""
    import tensorflow as tf

    from tfsyncmodes.keras import once

    on_ps = once.AppliedSteps.on_ps

    def sending(self, writes, grads, *rest):
        first = [g for g in tf.nest.flatten(grads) if g is not None][0]
        with tf.device(self.ring.device):
            held = tf.reduce_sum(first)  # this op needs the gradient on the server
        with tf.control_dependencies([held]):
            done = abort_once(step_id_to_lose, fired, claims, "lost sending its step's values")
        with tf.control_dependencies([done]):
            rest = tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), rest)
        return on_ps(self, writes, grads, *rest)

    record_traced_step_ids()
    once.AppliedSteps.on_ps = sending


def linear_fit(outdir, strategy, keras, dataset_fn, name):
    import tensorflow as tf

    import tfsyncmodes

    with strategy.scope():
        keras.utils.set_random_seed(4)
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
        optimizer = tfsyncmodes.wrap(keras.optimizers.SGD(ONCE_LR), "async")
        # Linear in the kernel: the gradient is the batch's mean features, whatever was read.
        model.compile(optimizer=optimizer, jit_compile=False, metrics=["mean_absolute_error"],
                      loss=lambda y_true, y_pred: tf.reduce_mean(y_pred))
        fired = tf.Variable(0, dtype=tf.int64, trainable=False, name="test_fired")
        claims = tf.Variable(0, dtype=tf.int64, trainable=False, name="test_claims")
        counted = tf.Variable(tf.zeros([4], tf.int64), trainable=False, name="test_counted")
        ended = tf.Variable(tf.zeros([], tf.float64), trainable=False, name="test_ended")
    exactly_once = strategy.config.exactly_once
    if name == "lost_after_update":
        abort_after(ABORT_AT if exactly_once else 0, fired, claims)
    elif name in ("lost_writing", "lost_writing_counted"):
        from tests.workers.async_writing import abort_while_writing
        abort_while_writing(ABORT_AT, fired, claims, os.path.join(outdir, name + ".aborted"), ended,
                            counted if name == "lost_writing_counted" else None)
    else:
        abort_while_sending(ABORT_AT, fired, claims)
    history = strategy.fit(model, lambda context: dataset_fn(context).map(
        lambda features, labels: (features, tf.cast(labels, tf.float32))),
        epochs=2, steps_per_epoch=ONCE_STEPS, verbose=0)
    metric = [leaf for m in model.metrics for leaf in (getattr(m, "metrics", None) or [m])
              if leaf.name == "mean_absolute_error"][0]
    count = [float(np.asarray(v)) for v in metric.variables if "count" in v.name][0]
    np.savez(os.path.join(outdir, name + ".npz"), kernel=np.asarray(model.get_weights()[0]),
             x=data()[0], steps=2 * ONCE_STEPS, lr=ONCE_LR, batch=BATCH, metric_count=count,
             iterations=int(np.asarray(optimizer.iterations)), fired=int(fired.numpy()),
             exactly_once=exactly_once, counted=np.asarray(counted.read_value()),
             ended=float(ended.numpy()),
             history_loss=np.array(history.history["loss"]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
