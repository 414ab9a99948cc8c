"""What every mode's strategy offers training code.

A :class:`ModeStrategy` behaves like a ``tf.distribute.Strategy`` where a user expects one
(``scope()``, ``num_replicas_in_sync``, ``distribute_datasets_from_function``,
``experimental_distribute_dataset``, ``reduce``) and also answers what training code needs in
every mode: whether this process is the chief, batch sizes per replica and overall, the
callbacks the mode requires, and a ``fit`` that trains a compiled model the way the mode and
the Keras version allow.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from tfsyncmodes import context, faults, registry
from tfsyncmodes.config import SyncConfig
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.keras import make_optimizer
from tfsyncmodes.keras import compat
from tfsyncmodes.keras.compat import keras
from tfsyncmodes.keras.resume import CheckpointFromBackup, ResumeFromBackup
from tfsyncmodes.paths import usable_directory


class Mode:
    """A way of keeping replicas in step, as registered in :data:`tfsyncmodes.registry.MODES`:
    how its strategy is made. (What its optimizers exchange is its recipe in
    :mod:`tfsyncmodes.exchange.recipes`.) A new mode is a subclass in a module of its own with
    ``@MODES.register("name")``."""

    def make_strategy(self, config: SyncConfig, horovod, tf_config) -> "ModeStrategy":
        """The strategy for this process, from the config and how it was launched (Horovod's
        environment or None, TF_CONFIG or None)."""
        raise NotImplementedError


class ModeStrategy:
    """Base class; subclasses set the engine in ``__init__`` and override what differs.

    A strategy owns its resolved, immutable :attr:`config`; optimizers wrapped with
    :meth:`wrap` (or ``tfsyncmodes.wrap`` inside :meth:`scope`) are built from exactly it.

    Attributes:
        config: the run's :class:`~tfsyncmodes.config.SyncConfig` (``config.describe()``: the
            knobs in force and where each value came from).
        mode: ``"sync"``, ``"async"`` or ``"hybrid"`` (a switching run: the mode it trains in now).
        backend: what carries the exchange: ``"horovod"``, ``"multi_worker"``, ``"mirrored"``
            or ``"parameter_server"``.
    """

    mode = "sync"
    backend = "none"

    def __init__(self, config: SyncConfig, tf_strategy: tf.distribute.Strategy):
        self.config = config
        self._tf_strategy = tf_strategy

    @property
    def groups(self):
        """Hybrid groups and their process sets (None: the mode has none)."""
        return None

    def wrap(self, optimizer, mode: Optional[str] = None, *, config: Optional[SyncConfig] = None,
             exchange=None):
        """`optimizer` wrapped so that its gradients go through this strategy's exchange,
        built from this strategy's config (or `config`, for a model that needs other knobs of
        the same mode), or through `exchange`, a chain of parts the user composed."""
        config = config or self.config
        for asked, what in ((mode, "wrap(mode=...)"), (config.mode, "wrap(config=...)")):
            if asked is not None and asked != self.mode:
                raise ConfigError(what, "mode", f"{asked!r} contradicts the strategy's mode {self.mode!r} "
                                  f"(from {self.config.sources.get('mode', 'default')})",
                                  f"wrap without a mode, or make the strategy with make_strategy({asked!r})")
        return make_optimizer(optimizer, config, self.groups, active_mode=self.mode, exchange=exchange)

    # --- what a tf.distribute.Strategy offers -------------------------------------------
    @property
    def tf_strategy(self) -> tf.distribute.Strategy:
        """The ``tf.distribute`` strategy underneath (the default strategy under Horovod)."""
        return self._tf_strategy

    @contextlib.contextmanager
    def scope(self):
        """The underlying strategy's scope; inside it, ``tfsyncmodes.wrap`` uses this strategy."""
        with context.entered(self), self._tf_strategy.scope():
            yield self

    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas whose gradients each step combines (Horovod: its ranks; async: the workers')."""
        return self._tf_strategy.num_replicas_in_sync

    @property
    def extended(self):
        return self._tf_strategy.extended

    def distribute_datasets_from_function(self, dataset_fn: Callable, options=None):
        return self._tf_strategy.distribute_datasets_from_function(dataset_fn, options)

    def experimental_distribute_dataset(self, dataset: tf.data.Dataset, options=None):
        return self._tf_strategy.experimental_distribute_dataset(dataset, options)

    def run(self, fn, args=(), kwargs=None):
        return self._tf_strategy.run(fn, args=args, kwargs=kwargs)

    def reduce(self, reduce_op, value, axis=None):
        return self._tf_strategy.reduce(reduce_op, value, axis=axis)

    # --- what training code needs in every mode ------------------------------------------
    @property
    def is_chief(self) -> bool:
        """Whether this process logs, evaluates and writes checkpoints (Horovod's rank 0, the
        ``chief`` task, the one process of a one-host run)."""
        return True

    @property
    def worker_index(self) -> int:
        """This process's index among the processes that compute gradients."""
        return 0

    @property
    def num_workers(self) -> int:
        """Processes that compute gradients (each may hold several replicas)."""
        return 1

    def per_replica_batch_size(self, global_batch_size: int) -> int:
        """`global_batch_size` split over the replicas (a ConfigError when it does not split)."""
        if global_batch_size % self.num_replicas_in_sync:
            raise ConfigError(
                "argument", "global_batch_size",
                f"{global_batch_size} does not split evenly over {self.num_replicas_in_sync} replicas",
                f"use a multiple of {self.num_replicas_in_sync}")
        return global_batch_size // self.num_replicas_in_sync

    def global_batch_size(self, per_replica_batch_size: int) -> int:
        """The batch all replicas together take in one step."""
        return per_replica_batch_size * self.num_replicas_in_sync

    def input_context(self) -> tf.distribute.InputContext:
        """The input context of this process's pipeline, as a dataset function receives it."""
        return tf.distribute.InputContext(
            num_input_pipelines=self.num_workers,
            input_pipeline_id=self.worker_index,
            num_replicas_in_sync=self.num_replicas_in_sync)

    def required_callbacks(self) -> List:
        """Callbacks the mode needs on every process for correct training. Fault injection
        (``--sync_slow_worker``) is not among them: :meth:`callbacks` and :meth:`fit` add
        :func:`tfsyncmodes.faults.callbacks_for` after them."""
        return self._correctness_callbacks()

    def _correctness_callbacks(self) -> List:
        """What the engine needs for correct training (e.g. Horovod's initial broadcast)."""
        return []

    def callbacks(self, model_dir: Optional[str] = None, checkpoint: bool = True,
                  tensorboard: bool = True) -> List:
        """The mode's required callbacks, resuming from `model_dir`/backup after a failure
        (every process restores, the chief writes), then chief-only checkpoint and TensorBoard
        logging under `model_dir`."""
        callbacks = self.required_callbacks() + faults.callbacks_for(self.config, self.worker_index)
        if model_dir:
            usable_directory(model_dir, "argument", "model_dir")
        phase = self.phase_callback(model_dir)
        if not model_dir:
            return callbacks + ([phase] if phase is not None else [])
        log_dir = os.path.join(model_dir, "logs")  # one TensorBoard log for a run of phases too
        if phase is not None:  # a launched phase keeps its backup and checkpoints apart
            model_dir = phase.phase_dir
        backup = None
        if checkpoint:
            backup = ResumeFromBackup(os.path.join(model_dir, "backup"), writes=self._backup_writes())
            callbacks.insert(0, backup)
        if self.is_chief:
            os.makedirs(model_dir, exist_ok=True)
            if checkpoint:
                path = os.path.join(model_dir, "checkpoint.weights.h5")
                callbacks.append(CheckpointFromBackup(path, backup) if self._checkpoint_copies_backup()
                                 else keras.callbacks.ModelCheckpoint(path, save_weights_only=True))
            if tensorboard:
                callbacks.append(keras.callbacks.TensorBoard(log_dir))
        if phase is not None:  # first: the phase's checkpoint, then a backup of this phase, if any
            callbacks.insert(0, phase)
        return callbacks

    def phase_callback(self, model_dir: Optional[str] = None):
        """In a process ``python -m tfsyncmodes.launch`` started for one phase of a
        ``--sync_mode_schedule`` through async: the callback that runs the phase
        (:class:`tfsyncmodes.switching.phases.run.PhaseRun`, asked of the switch plans); None
        otherwise. :meth:`callbacks` and :meth:`fit` add it, so a script runs a schedule
        through async unchanged."""
        for name in registry.SWITCH_PLANS.names():
            callback = registry.SWITCH_PLANS.get(name)().phase_callback(self, model_dir)
            if callback is not None:
                return callback
        return None

    def _checkpoint_copies_backup(self) -> bool:
        """Whether the chief's checkpoint copies the backup's file of the same epoch's end
        (:class:`~tfsyncmodes.keras.resume.CheckpointFromBackup`): only where no callback
        between the two changes a weight at an epoch's end and reading the weights costs
        calls to other processes. False: a save of its own."""
        return False

    def _backup_writes(self):
        """Which process writes the resume backup: the chief (None: the engine decides)."""
        return self.is_chief

    def fit(self, model, dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset], *,
            epochs: int = 1, steps_per_epoch: Optional[int] = None, callbacks: Sequence = (),
            verbose: Optional[int] = None, input_options: Optional[tf.distribute.InputOptions] = None):
        """Trains a compiled `model` on the per-replica-batched datasets `dataset_fn` makes.

        The mode's required callbacks are added in front of `callbacks` unless they are
        there already (e.g. from :meth:`callbacks`). `input_options` go to
        ``distribute_datasets_from_function`` as tf.distribute's do. Returns the History.
        """
        dataset = self.distribute_datasets_from_function(dataset_fn, input_options)
        if isinstance(dataset, tf.data.Dataset):  # a rank's own pipeline (Horovod)
            compat.build_metrics(model, dataset)
        if verbose is None:
            verbose = self.default_verbose()
        return model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, shuffle=False,
                         callbacks=self.with_required_callbacks(callbacks), verbose=verbose)

    def default_verbose(self) -> int:
        """Keras' ``verbose="auto"`` for this process: a progress bar on the chief's terminal,
        one line per epoch when its output is not a terminal (as under horovodrun), nothing
        on the other processes."""
        if not self.is_chief:
            return 0
        return 1 if sys.stdout.isatty() else 2

    def with_required_callbacks(self, callbacks: Sequence) -> List:
        """`callbacks` with the mode's required ones, the fault injection's
        (:func:`tfsyncmodes.faults.callbacks_for`) and a launched phase's (:meth:`phase_callback`)
        in front, unless already there."""
        callbacks = list(callbacks)
        present = {type(c) for c in callbacks}
        added = self.required_callbacks() + faults.callbacks_for(self.config, self.worker_index)
        phase = self.phase_callback()  # a launched phase's, unless the caller has it already
        if phase is not None and type(phase) not in present:
            added.insert(0, phase)
        return [c for c in added if type(c) not in present] + callbacks

    def describe(self) -> str:
        """One line: mode, backend, replicas and where this process stands (the configuration's
        own lines: ``strategy.config.describe()``)."""
        return (f"mode={self.mode} backend={self.backend} replicas={self.num_replicas_in_sync} "
                f"workers={self.num_workers} worker_index={self.worker_index} chief={self.is_chief}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"
