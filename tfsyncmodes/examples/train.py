"""Trains a small classifier data-parallel, in whichever mode --sync_mode names.

    tfsyncmodes-train                                         # sync, one process
    horovodrun -np 4 tfsyncmodes-train --sync_mode=sync       # sync, Horovod allreduce
    TF_CONFIG=... tfsyncmodes-train                           # sync, MultiWorkerMirrored

(``python scripts/train.py`` in a checkout is the same program, without TensorFlow's start-up
lines.) It needs scikit-learn for the digits: ``pip install 'tfsyncmodes[examples]'``.

Data: scikit-learn's bundled 8x8 digits (no download), or a synthetic set of any size for
benchmarks. Every worker trains on its own shard; the chief prints the test accuracy, writes
checkpoints and TensorBoard logs under --model_dir and saves the final model there.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf
from absl import flags, logging

import tfsyncmodes
from tfsyncmodes.errors import ConfigError, at_least
from tfsyncmodes.examples import emulated_compute
from tfsyncmodes.examples import run_metrics
from tfsyncmodes.keras.compat import keras
from tfsyncmodes.paths import usable_directory
from tfsyncmodes.switching.phases import plan as phase_plan

flags.DEFINE_integer("epochs", 10, "Passes over the training set.")
flags.DEFINE_integer("batch_size", 64, "Global batch size (split evenly over the replicas).")
flags.DEFINE_float("learning_rate", None,
                   "Learning rate (default: 0.01 for Adam, 0.02 for SGD with --momentum).")
flags.DEFINE_float("momentum", 0.9, "Momentum of the SGD optimizer async mode (and a --sync_mode_schedule "
                   "through async, and --optimizer=sgd) trains with.", lower_bound=0.0, upper_bound=0.999)
flags.DEFINE_enum("optimizer", "auto", ["auto", "adam", "sgd"],
                  "auto: Adam in sync and hybrid modes, SGD with --momentum in async mode (and through "
                  "a --sync_mode_schedule); sgd: SGD with --momentum (--momentum=0 with --sync_dgc, whose "
                  "momentum correction holds the momentum); adam: Adam.")
flags.DEFINE_enum("dataset", "digits", ["digits", "synthetic"],
                  "digits: scikit-learn's bundled digits; synthetic: generated, see --synthetic_*.")
flags.DEFINE_integer("synthetic_samples", 8192, "Examples in the synthetic training set.")
flags.DEFINE_integer("synthetic_features", 256, "Features of each synthetic example.")
flags.DEFINE_integer("hidden_units", 128, "Width of the hidden layers.")
flags.DEFINE_string("model_dir", "runs/train", "Chief-only checkpoints, TensorBoard logs, final model.")
flags.DEFINE_integer("seed", 0, "Seed for the data split and the initial weights.")
flags.DEFINE_string("metrics_file", None, "If set, the chief writes the final metrics here as JSON.")
flags.DEFINE_string("model", None,
                    "module:function building your own (uncompiled) Keras model instead of the MLP: "
                    "called as function(num_features, num_classes), under the strategy's scope; "
                    "the model must end in logits. The module is imported from the working directory.")
flags.DEFINE_string("data", None,
                    "module:function returning your own (x_train, y_train, x_test, y_test) NumPy arrays "
                    "(float32 features, int32 labels in 0..9) instead of --dataset.")
flags.DEFINE_bool("eval_each_epoch", False,
                  "The chief measures the test accuracy at each epoch's end (its own model) and "
                  "writes it, with the seconds since training began, to --metrics_file.")

FLAGS = flags.FLAGS
NUM_CLASSES = 10


def load_data(seed: int):
    """(x_train, y_train, x_test, y_test) as float32 / int32 numpy arrays."""
    if FLAGS.data:
        x_train, y_train, x_test, y_test = _import_hook("--data", FLAGS.data)()
        return (np.asarray(x_train, "float32"), np.asarray(y_train, "int32"),
                np.asarray(x_test, "float32"), np.asarray(y_test, "int32"))
    if FLAGS.dataset == "digits":
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise ConfigError("flag", "--dataset", "digits needs scikit-learn, which is not installed",
                              "pip install 'tfsyncmodes[examples]', or use --dataset=synthetic") from None

        digits = load_digits()
        x = (digits.data / 16.0).astype("float32")
        y = digits.target.astype("int32")
    else:
        if FLAGS.synthetic_samples < 2 * FLAGS.batch_size:
            raise ConfigError("flag", "--synthetic_samples", f"{FLAGS.synthetic_samples} is too few",
                              f"use at least 2 x --batch_size = {2 * FLAGS.batch_size}")
        rng = np.random.default_rng(seed)
        total = FLAGS.synthetic_samples * 5 // 4
        x = rng.standard_normal((total, FLAGS.synthetic_features)).astype("float32")
        teacher = rng.standard_normal((FLAGS.synthetic_features, NUM_CLASSES)).astype("float32")
        y = np.argmax(x @ teacher, axis=1).astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    split = len(x) * 4 // 5
    train, test = order[:split], order[split:]
    return x[train], y[train], x[test], y[test]


def _import_hook(flag: str, spec: str):
    """The function `spec` ('module:function') names; bad specs are a ConfigError."""
    import importlib

    module_name, _, function_name = spec.partition(":")
    fix = f"give {flag}=module:function with the module importable from the working directory"
    if not module_name or not function_name:
        raise ConfigError("flag", flag, f"{spec!r} is not module:function", fix)
    sys.path.insert(0, os.getcwd())
    try:
        function = getattr(importlib.import_module(module_name), function_name, None)
    except ImportError as error:
        raise ConfigError("flag", flag, f"cannot import {module_name!r} ({error})", fix) from None
    if not callable(function):
        raise ConfigError("flag", flag, f"{module_name} has no function {function_name!r}", fix)
    return function


def build_model(num_features: int):
    keras.utils.set_random_seed(FLAGS.seed)
    if FLAGS.model:
        return _import_hook("--model", FLAGS.model)(num_features, NUM_CLASSES)
    # Under emulated compute the variables are read after the batch's wait (see ReadsAfterBatch).
    sequential = emulated_compute.ReadsAfterBatch if FLAGS.compute_ms > 0 else keras.Sequential
    return sequential([
        keras.Input((num_features,)),
        keras.layers.Dense(FLAGS.hidden_units, activation="relu"),
        keras.layers.Dense(FLAGS.hidden_units, activation="relu"),
        keras.layers.Dense(NUM_CLASSES),
    ])


def train(argv):
    del argv
    emulated_compute.check_flags()
    for flag, spec in (("--model", FLAGS.model), ("--data", FLAGS.data)):
        if spec:
            _import_hook(flag, spec)  # a bad hook fails here, before any TensorFlow work
    tf.get_logger().setLevel("WARNING")
    for name, low in (("epochs", 1), ("batch_size", 1), ("synthetic_samples", 1), ("synthetic_features", 1),
                      ("hidden_units", 1)):
        at_least(FLAGS[name].value, low, "flag", f"--{name}")
    at_least(FLAGS.learning_rate, 1e-12, "flag", "--learning_rate", "use a positive number, e.g. 0.01")
    at_least(FLAGS.compute_ms, 0.0, "flag", "--compute_ms", "use 0 (no emulated compute) or more milliseconds")
    if not 0 <= FLAGS.seed < 2**32:  # NumPy's seed range, which Keras' set_random_seed uses
        raise ConfigError("flag", "--seed", f"{FLAGS.seed} is out of range", "use 0..4294967295")
    usable_directory(FLAGS.model_dir, "flag", "--model_dir")
    for name in ("metrics_file",):
        if FLAGS[name].value:
            usable_directory(os.path.dirname(FLAGS[name].value) or ".", "flag", f"--{name}")
    phase_plan.check_launched(tfsyncmodes.resolve())  # a schedule through async needs the launcher
    strategy = tfsyncmodes.make_strategy()
    if strategy.is_chief:
        # The knobs in force (in any mode of a schedule); every knob with --verbosity=1.
        logging.info("%s", strategy.config.describe(every=logging.get_verbosity() >= logging.DEBUG))
        logging.info("strategy: %s", strategy.describe())
    else:
        logging.set_verbosity(logging.WARNING)
    if FLAGS.batch_size < strategy.num_replicas_in_sync:
        raise ConfigError("flag", "--batch_size", f"{FLAGS.batch_size} is smaller than the "
                          f"{strategy.num_replicas_in_sync} replicas",
                          f"use a multiple of {strategy.num_replicas_in_sync}")
    strategy.per_replica_batch_size(FLAGS.batch_size)  # fails early on an uneven split

    x_train, y_train, x_test, y_test = load_data(FLAGS.seed)
    steps_per_epoch = len(x_train) // FLAGS.batch_size
    # A phase of a --sync_mode_schedule through async, as python -m tfsyncmodes.launch runs it (None
    # outside one): strategy.callbacks() runs it (its epochs, the checkpoint it starts from and
    # writes, the run's History); here only the choice of one optimizer for every phase.
    phase = strategy.phase_callback()

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        dataset = dataset.shuffle(len(x_train), seed=FLAGS.seed + context.input_pipeline_id)
        batch = context.get_per_replica_batch_size(FLAGS.batch_size)
        dataset = dataset.repeat().batch(batch, drop_remainder=True).prefetch(2)
        if FLAGS.compute_ms > 0:
            dataset = emulated_compute.step_waits(dataset, context, strategy.mode == "async",
                                                  FLAGS.batch_size, FLAGS.seed)
        # Nothing here for tf.data to tune (a fixed prefetch); with its autotuning on, dropping
        # the iterator at the end of a fit sometimes waited out the autotuner's period, up to a
        # minute (docs/fault-tolerance.md).
        options = tf.data.Options()
        options.autotune.enabled = False
        return dataset.with_options(options)

    with strategy.scope():
        model = build_model(x_train.shape[1])
        sgd = FLAGS.optimizer == "sgd" or (FLAGS.optimizer == "auto" and (strategy.mode == "async" or phase is not None))
        if sgd:  # one optimizer through every phase
            # SGD with momentum, as the async figures were measured (Adam works too: the
            # staleness remedies then scale its update rather than its gradient).
            optimizer = keras.optimizers.SGD(FLAGS.learning_rate or 0.02, momentum=FLAGS.momentum)
        else:
            optimizer = keras.optimizers.Adam(FLAGS.learning_rate or 0.01)
        model.compile(
            optimizer=strategy.wrap(optimizer),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            # This Horovod build has no XLA kernels, and Keras 3 turns XLA on by itself on GPUs
            # when no tf.distribute strategy is active (the Horovod case).
            jit_compile=False,
        )
    # A run through a --sync_mode_schedule keeps one directory for all its phases.
    model_dir = os.path.join(FLAGS.model_dir, "schedule" if strategy.config.mode_schedule else strategy.mode)
    callbacks = strategy.callbacks(FLAGS.model_dir if phase is not None else model_dir)
    phase = next((c for c in callbacks if type(c) is type(phase)), None) if phase is not None else None
    if phase is not None:  # the phase's own backup and model; the loss across each switch
        model_dir = phase.phase_dir
        phase.eval_data = (x_train[:512], y_train[:512])
    started, started_unix = time.perf_counter(), time.time()
    curve = []  # (seconds since the start, test accuracy) at each epoch's end, on the chief

    class EpochAccuracy(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - started
            logits = np.asarray(model(x_test, training=False))
            curve.append((round(seconds, 3), float(np.mean(np.argmax(logits, axis=1) == y_test))))

    first_step = []  # seconds from the start to the first step's end (tracing and start-up), on the chief

    class FirstStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if not first_step:
                first_step.append(round(time.perf_counter() - started, 3))

    extra = [EpochAccuracy()] if FLAGS.eval_each_epoch and strategy.is_chief else []
    # Timed only when the epochs are (benchmark runs): a batch-level callback costs every step a
    # look at the logs. ParameterServerStrategy refuses batch-level callbacks: async leaves it out.
    if FLAGS.eval_each_epoch and strategy.is_chief and strategy.backend != "parameter_server":
        extra.append(FirstStep())
    # Under emulated compute an async worker reads no batch, and so no wait, ahead of its step.
    options = emulated_compute.input_options(strategy.mode == "async") if FLAGS.compute_ms > 0 else None
    history = strategy.fit(model, dataset_fn, epochs=FLAGS.epochs, steps_per_epoch=steps_per_epoch,
                           callbacks=callbacks + extra, input_options=options)
    seconds = time.perf_counter() - started

    if strategy.is_chief:
        logits = np.asarray(model(x_test, training=False))
        accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
        model.save(os.path.join(model_dir, "model.keras"))
        metrics = {
            "mode": strategy.mode, "backend": strategy.backend,
            "replicas": strategy.num_replicas_in_sync, "epochs": FLAGS.epochs,
            "steps": int(np.asarray(model.optimizer.iterations)),
            # Epochs this run trained (a resumed run starts after the last completed one; a
            # rerun of a finished run trains none).
            "epochs_run": [int(e) for e in history.epoch],
            "losses": [float(v) for v in history.history.get("loss", [])],
            "final_loss": float(history.history["loss"][-1]) if history.history.get("loss") else None,
            "test_accuracy": accuracy, "train_seconds": round(seconds, 3),
            "params": int(model.count_params()), "batch_size": FLAGS.batch_size,
            "steps_per_epoch": steps_per_epoch, "fit_started_unix": started_unix,
        }
        if first_step:
            metrics["first_step_seconds"] = first_step[0]
        if curve:
            metrics["epoch_seconds"], metrics["epoch_accuracy"] = [c[0] for c in curve], [c[1] for c in curve]
        if strategy.config.mode_schedule:
            metrics["mode_schedule"] = strategy.config.mode_schedule
        if "mode" in history.history:  # a switching run: the mode each epoch ended in (sync 0, hybrid 2)
            metrics["modes"] = [float(v) for v in history.history["mode"]]
        for key in ("staleness_mean", "staleness_max", "staleness", "bytes_sent", "compression_ratio",
                    "cross_group_lag", "dropped_updates", "mode_switches", "switch_seconds"):
            if key in history.history:
                metrics[key] = [float(v) for v in history.history[key]]
        for key in sorted(k for k in history.history if k.startswith("local_steps_")):
            metrics[key] = [float(v) for v in history.history[key]]
        metrics["samples"] = run_metrics.trained_samples(history.history, metrics["steps"], steps_per_epoch,
                                                         FLAGS.batch_size)
        if phase is not None:
            metrics.update(phase.metrics())
        print(f"test accuracy: {accuracy:.4f} ({strategy.describe()}, {seconds:.1f}s)", flush=True)
        if FLAGS.metrics_file:
            os.makedirs(os.path.dirname(os.path.abspath(FLAGS.metrics_file)), exist_ok=True)
            with open(FLAGS.metrics_file, "w", encoding="utf-8") as handle:
                json.dump(metrics, handle)


def main() -> None:
    """The ``tfsyncmodes-train`` command."""
    tfsyncmodes.run(train)


if __name__ == "__main__":
    main()
