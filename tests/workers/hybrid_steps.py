"""Trains a linear model in hybrid mode under several settings and saves what the tests need.

    horovodrun -np 4 python hybrid_steps.py OUTDIR SCENARIOS_JSON [--steps=N] [--optimizer=sgd]

SCENARIOS_JSON maps a scenario name to knob overrides (compression, staleness, ...), or to
{"composed": SETTINGS}: a periodic exchange composed in Python from typed parts (see
composed_exchange), passed as strategy.wrap(optimizer, exchange=...). A scenario's
"sleep_after_step": {RANK: SECONDS} makes those ranks sleep after every step (stragglers of
chosen speeds; --sync_slow_worker=INDEX:FACTOR among the knobs sleeps FACTOR / 4 seconds), and
its "steps" the steps it trains (default --steps). The groups come from the
environment (TFSYNC_GROUP_SIZE / TFSYNC_GROUPS). Every rank gets its own
rows of a dataset every process can rebuild from the seed, and starts from its own weights,
so equal results prove the initial broadcast. Saves OUTDIR/<scenario>.rank<R>.npz.
"""
import json
import os
import sys
import time

import numpy as np

from tests import reference


def composed_exchange(groups, settings):
    """Periodic averaging over `groups`, composed by hand: Top-K (`topk_ratio`) with error
    feedback, `period`, and the outer step `outer` ("average", or "nesterov" with `outer_lr`
    and `outer_momentum`)."""
    from tfsyncmodes.exchange import (AverageOuter, NesterovOuter, PeriodicAverage, TopK, cross_group_link,
                                      hybrid_chain)

    link = cross_group_link(groups, TopK(ratio=settings["topk_ratio"]))
    outer = (NesterovOuter(lr=settings["outer_lr"], momentum=settings["outer_momentum"])
             if settings.get("outer") == "nesterov" else AverageOuter())
    return hybrid_chain(groups, PeriodicAverage(link, period=settings["period"], outer=outer))


def main(argv):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("scenarios")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--optimizer", default="sgd")
    args = parser.parse_args(argv)

    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes import config as config_lib
    from tfsyncmodes.exchange.policies import CrossGroupPolicy
    from tfsyncmodes.keras.compat import keras
    from tfsyncmodes.faults import slow_worker_factor

    def links(optimizer):
        return [p.link for p in optimizer.exchange.find(CrossGroupPolicy)]

    class SleepAfterStep(keras.callbacks.Callback):
        """A scenario's straggler: sleeps a fixed time after every step (FACTOR / 4 seconds for
        --sync_slow_worker=INDEX:FACTOR), far above a step of this model on a loaded host, from the
        first step on."""

        def __init__(self, seconds):
            super().__init__()
            self.seconds = seconds

        def on_train_batch_end(self, batch, logs=None):
            time.sleep(self.seconds)

    class RoundsApplied(keras.callbacks.Callback):
        """After each step: how many background cross-group rounds this rank has applied, and
        the bytes it put on the cross-group wire in that step (the link's traffic counter)."""

        def on_train_begin(self, logs=None):
            self.after_step, self.step_bytes = [], []

        def on_train_batch_end(self, batch, logs=None):
            found = links(self.model.optimizer)
            applied = found[0].rounds_applied() if found else None
            if applied is not None:
                self.after_step.append(applied)
            if found:
                self.step_bytes.append(found[0].bytes_sent())

    strategy = tfsyncmodes.make_strategy("hybrid")
    base = strategy.config
    rank = strategy.worker_index
    replicas = strategy.num_replicas_in_sync

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((x[:, rank], y[:, rank])).unbatch().batch(reference.BATCH)

    for name, overrides in json.loads(args.scenarios).items():
        overrides = dict(overrides)
        steps = int(overrides.pop("steps", args.steps))
        x, y = reference.linear_data(steps, replicas)  # what dataset_fn reads
        composed = overrides.pop("composed", None)
        sleeps = {int(r): float(t) for r, t in overrides.pop("sleep_after_step", {}).items()}
        knobs = config_lib.resolve(dict(overrides, mode="hybrid"), environ={
            k: v for k, v in os.environ.items() if k.startswith("TFSYNC_")}, use_flags=False)
        with strategy.scope():
            keras.utils.set_random_seed(100 + rank)
            model = keras.Sequential([keras.Input((reference.FEATURES,)),
                                      keras.layers.Dense(reference.OUTPUTS)])
            initial = [np.array(w) for w in model.get_weights()]
            inner = (keras.optimizers.SGD(reference.LR) if args.optimizer == "sgd"
                     else keras.optimizers.Adam(reference.LR))
            optimizer = (strategy.wrap(inner, exchange=composed_exchange(strategy.groups, composed))
                         if composed is not None else tfsyncmodes.wrap(inner, config=knobs))
            model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
        rounds = RoundsApplied()
        # A scenario's own straggler (--sync_slow_worker among its knobs), after the required callbacks.
        factor = slow_worker_factor(knobs, rank)
        slow = [SleepAfterStep(factor / 4.0)] if factor > 1.0 and not base.slow_worker else []
        slow += [SleepAfterStep(sleeps[rank])] if rank in sleeps else []
        history = strategy.fit(model, dataset_fn, epochs=1, steps_per_epoch=steps, verbose=0,
                               callbacks=[rounds] + slow)
        found = links(model.optimizer)
        policy = model.optimizer.exchange.find(CrossGroupPolicy)
        recorded = getattr(policy[0], "recorded_rounds", None) if policy else None
        round_steps = recorded() if recorded else np.zeros((0, 0), np.int64)
        plan_inputs = getattr(policy[0], "recorded_plan_inputs", None) if policy else None
        round_times, round_left, round_epoch = (plan_inputs() if plan_inputs else
                                                (np.zeros((0, 0)), np.zeros((0, 0), np.int64), np.zeros(0, np.int64)))
        local_steps = {k: v[-1] for k, v in history.history.items() if k.startswith("local_steps")}
        final = model.get_weights()
        center = [np.asarray(v) for v in model.optimizer.variables
                  if "elastic_center" in (getattr(v, "path", None) or v.name)]  # elastic's state
        np.savez(os.path.join(args.outdir, f"{name}.rank{rank}.npz"),
                 kernel0=initial[0], bias0=initial[1], kernel=final[0], bias=final[1],
                 iterations=int(np.asarray(model.optimizer.iterations)),
                 groups=np.array(strategy.layout.groups), group=strategy.group_index,
                 bytes_sent=history.history.get("bytes_sent", [-1.0])[-1],
                 compression_ratio=history.history.get("compression_ratio", [-1.0])[-1],
                 dense_bytes=found[0].dense_bytes if found else 0,
                 schedule=np.array(rounds.after_step, np.int64), step_bytes=np.array(rounds.step_bytes, np.int64),
                 lag=history.history.get("cross_group_lag", [-1.0])[-1],
                 optimizer_class=type(model.optimizer).__name__, groups_knob=base.groups,
                 center=center[0] if center else np.zeros(0, np.float32),
                 round_steps=round_steps, local_steps=json.dumps(local_steps),
                 round_times=round_times, round_left=round_left, round_epoch=round_epoch,
                 description=strategy.describe())


if __name__ == "__main__":
    main(sys.argv[1:])
