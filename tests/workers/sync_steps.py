"""Trains a linear model for a few steps in sync mode and saves what the test needs to check it.

    python sync_steps.py OUTDIR [--optimizer=sgd|adam] [--steps=N] [--logical_cpus=N] [--sync_...]
    horovodrun -np N python sync_steps.py OUTDIR --scenarios=JSON [--steps=N] [--reduce]

Runs under horovodrun, under a TF_CONFIG cluster, or alone (MirroredStrategy). Every replica
gets its own rows of a dataset that every process can rebuild from the seed; each worker
starts from different initial weights, so identical results prove the initial broadcast.
tfsyncmodes' own ``--sync_`` flags are left to it (it reads them from the command line).
Saves OUTDIR/worker<I>.npz.

With --scenarios (under horovodrun), one job runs several trainings one after the other:
JSON maps a scenario name to its knobs, given to ``make_strategy("sync", ...)`` as code
arguments, and optionally its "optimizer" and "steps"; each saves OUTDIR/<name>.worker<I>.npz. --reduce
then has every rank contribute rank + 1 to ``strategy.reduce`` (SUM and MEAN) and saves the
two results in OUTDIR/reduce.worker<I>.npz.
"""
import json
import os
import sys
import time

import numpy as np

from tests import reference


def train(outdir, prefix, strategy, optimizer, steps):
    """One fit of `steps` steps under `strategy`; saves OUTDIR/<prefix>worker<I>.npz."""
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras

    replicas = strategy.num_replicas_in_sync
    x, y = reference.linear_data(steps, replicas)  # [step, replica, batch, ...]

    def dataset_fn(context):
        local = replicas // context.num_input_pipelines
        first = context.input_pipeline_id * local
        xs = x[:, first:first + local].reshape(-1, x.shape[-1])
        ys = y[:, first:first + local].reshape(-1, y.shape[-1])
        return tf.data.Dataset.from_tensor_slices((xs, ys)).batch(reference.BATCH)

    with strategy.scope():
        keras.utils.set_random_seed(100 + strategy.worker_index)
        model = keras.Sequential([keras.Input((reference.FEATURES,)), keras.layers.Dense(reference.OUTPUTS)])
        initial = [np.array(w) for w in model.get_weights()]
        inner = (keras.optimizers.SGD(reference.LR) if optimizer == "sgd"
                 else keras.optimizers.Adam(reference.LR))
        model.compile(optimizer=tfsyncmodes.wrap(inner, "sync"), loss="mse", jit_compile=False)
    history = strategy.fit(model, dataset_fn, epochs=1, steps_per_epoch=steps, verbose=0)
    final = model.get_weights()
    np.savez(os.path.join(outdir, f"{prefix}worker{strategy.worker_index}.npz"),
             kernel0=initial[0], bias0=initial[1], kernel=final[0], bias=final[1],
             iterations=int(np.asarray(model.optimizer.iterations)), replicas=replicas,
             epoch_loss=history.history["loss"][-1],
             backend=strategy.backend, optimizer_class=type(model.optimizer).__name__,
             bytes_sent=history.history.get("bytes_sent", [-1.0])[-1],
             compression_ratio=history.history.get("compression_ratio", [-1.0])[-1])


def let_the_timeline_drain(quiet_seconds=3.0, limit_seconds=30.0):
    """Waits until Horovod's timeline file (HOROVOD_TIMELINE, written by rank 0) has stopped
    growing for `quiet_seconds` (its writer thread, starved on a loaded machine, may pause for
    a second). Horovod's shutdown stops its timeline writer without writing the records still
    queued (horovod/common/timeline.cc, TimelineWriter::Shutdown), so a job that exits at once
    can lose its last steps' events: a loaded run once counted 1 grouped allreduce of 3."""
    path = os.environ.get("HOROVOD_TIMELINE")
    if not path:
        return
    deadline, last, since = time.monotonic() + limit_seconds, -1, time.monotonic()
    while time.monotonic() < deadline:
        size = os.path.getsize(path) if os.path.exists(path) else 0
        if size != last:
            last, since = size, time.monotonic()
        elif time.monotonic() - since >= quiet_seconds:
            return
        time.sleep(0.1)


def main(argv):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--logical_cpus", type=int, default=0)
    parser.add_argument("--backend", default=None)
    parser.add_argument("--scenarios", default=None)
    parser.add_argument("--reduce", action="store_true")
    args, _ = parser.parse_known_args(argv)  # the --sync_ flags are tfsyncmodes'

    import tensorflow as tf

    if args.logical_cpus:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus)

    import tfsyncmodes

    if args.scenarios is None:
        strategy = tfsyncmodes.make_strategy("sync", backend=args.backend)
        train(args.outdir, "", strategy, args.optimizer, args.steps)
    else:
        for name, knobs in json.loads(args.scenarios).items():
            knobs = dict(knobs)
            optimizer, steps = knobs.pop("optimizer", args.optimizer), knobs.pop("steps", args.steps)
            strategy = tfsyncmodes.make_strategy("sync", backend=args.backend, **knobs)
            train(args.outdir, f"{name}.", strategy, optimizer, steps)
    if args.reduce:
        value = tf.constant(float(strategy.worker_index + 1))
        np.savez(os.path.join(args.outdir, f"reduce.worker{strategy.worker_index}.npz"),
                 sum=float(strategy.reduce(tf.distribute.ReduceOp.SUM, value)),
                 mean=float(strategy.reduce(tf.distribute.ReduceOp.MEAN, value)))
    let_the_timeline_drain()


if __name__ == "__main__":
    main(sys.argv[1:])
