"""Async over ParameterServerStrategy: variables live on the ``ps`` tasks, ``worker`` tasks
compute and apply updates at their own pace, the ``chief`` coordinates.

The same script runs in every task of a TF_CONFIG cluster. In a ``worker`` or ``ps`` task,
:func:`make_parameter_server_strategy` starts that task's gRPC server and serves until the chief
is gone, then exits 0. In the ``chief`` it returns an :class:`AsyncStrategy` that owns the
``ParameterServerStrategy`` and its ``ClusterCoordinator``.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from typing import Callable, List, Optional

import tensorflow as tf
from absl import logging

from tfsyncmodes.cluster import TFConfig
from tfsyncmodes.config import SyncConfig
from tfsyncmodes.errors import ConfigError, JobFailure
from tfsyncmodes.keras import compat
from tfsyncmodes.keras.async_runner import CoordinatorRunner
from tfsyncmodes.keras.loop import fit_loop
from tfsyncmodes.faults import refuse_window, slow_worker_factor, throttle_self
from tfsyncmodes.registry import MODES
from tfsyncmodes.strategies import devices
from tfsyncmodes.strategies.base import Mode, ModeStrategy
from tfsyncmodes.watchdog import deadline

ROLES = ("chief", "worker", "ps")
# What TensorFlow raises when a parameter server stops answering mid-step or mid-save.
_LOST_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
                     tf.errors.DeadlineExceededError)
EXIT_SERVED = 0


@MODES.register("async")
class AsyncMode(Mode):
    def make_strategy(self, config, horovod, tf_config):
        return make_parameter_server_strategy(config, tf_config)


def make_parameter_server_strategy(config: SyncConfig, tf_config: Optional[TFConfig]):
    """The chief's strategy; in a worker or ps task, serves and never returns."""
    if tf_config is None:
        raise ConfigError("TF_CONFIG", "(unset)", "--sync_mode=async needs a cluster with chief, worker and ps tasks",
                          "set TF_CONFIG per task, or start a local cluster with "
                          "python -m tfsyncmodes.launch --workers 2 --ps 1 -- python your_script.py")
    tf_config.require_roles("async", allowed=ROLES, required=ROLES)
    if tf_config.task_type in ("worker", "ps"):
        serve(config, tf_config)
    return AsyncStrategy(config, tf_config)


LOST_PS_SECONDS = 3.0  # how long a lost parameter server's address is probed to name it
SILENT_SECONDS = 30.0  # a chief that neither answers nor refuses this long is taken as gone


def probe(address: str, timeout: float = 1.0) -> Optional[bool]:
    """True: the address answered; False: it refused (its host is up and nothing listens
    there: the chief's process is gone); None: no answer within `timeout` (a link that drops
    or queues the connection's packets, as a saturated one does, or a host that is gone)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except ConnectionRefusedError:
        return False
    except OSError:
        return None


class ChiefWatch:
    """Whether a task's chief has come and gone, from probes of its server's address: gone once
    it refuses after having answered, or after answering nothing for `silent` seconds. One probe
    that times out is not enough: on a saturated link (an async worker's pushes fill it) a
    connection's first packets can wait longer than a probe does."""

    def __init__(self, address: str, silent: float = SILENT_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.address, self.silent, self.clock = address, silent, clock
        self.seen = False
        self._quiet_since: Optional[float] = None

    def gone(self, timeout: float = 1.0) -> bool:
        up = probe(self.address, timeout)
        if up:
            self.seen, self._quiet_since = True, None
            return False
        if not self.seen:
            return False
        if up is False:
            return True
        now = self.clock()
        self._quiet_since = now if self._quiet_since is None else self._quiet_since
        return now - self._quiet_since >= self.silent


def serve(config: SyncConfig, tf_config: TFConfig) -> None:
    """Runs this task's server until the chief has come and gone, then exits the process.

    A ``tf.distribute.Server`` has no way to stop; the chief's own server address is the sign
    of life: once it has answered and then refuses, or answers nothing for
    :data:`SILENT_SECONDS` (:class:`ChiefWatch`), the job is over. A chief that never
    comes within ``collective_timeout`` seconds is an error.
    """
    task = f"{tf_config.task_type}:{tf_config.task_index}"
    # A worker keeps the GPUs its host assigned (CUDA_VISIBLE_DEVICES); a ps task uses none.
    devices.place(devices.PS if tf_config.task_type == "ps" else devices.WORKER)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=tf_config.task_type,
                                  task_index=tf_config.task_index, protocol="grpc", start=True)
    del server  # kept alive by the runtime until the process exits
    if tf_config.task_type == "worker":
        refuse_window(config, "an async worker (throttled as a whole process)")
        factor = slow_worker_factor(config, tf_config.task_index)
        if factor > 1.0:
            throttle_self(factor)
    chief = tf_config.cluster["chief"][0]
    started = time.monotonic()
    watch = ChiefWatch(chief)
    while True:
        if watch.gone():
            print(f"tfsyncmodes: {task}: chief {chief} is gone; exiting", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(EXIT_SERVED)
        if not watch.seen and time.monotonic() - started > config.collective_timeout:
            print(f"tfsyncmodes: error: {task}: the chief at {chief} did not start within "
                  f"{config.collective_timeout:g}s; start the chief task or raise --sync_collective_timeout",
                  file=sys.stderr, flush=True)
            os._exit(2)
        time.sleep(0.5)


class AsyncStrategy(ModeStrategy):
    """The chief's side of async mode: a ParameterServerStrategy and its ClusterCoordinator."""

    mode = "async"
    backend = "parameter_server"

    def __init__(self, config: SyncConfig, tf_config: TFConfig):
        refuse_window(config, "async mode (its workers are throttled as whole processes)")
        self.cluster = tf_config
        self.device_plan = devices.place(devices.WORKER)  # the chief: its host's GPUs, memory growth
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        partitioner = None
        num_ps = tf_config.num_tasks("ps")
        if config.ps_shards > 1:
            if not compat.LEGACY:
                raise ConfigError(config.sources.get("ps_shards", "default"), "ps_shards",
                                  "Keras 3 optimizers cannot update variables split over several ps "
                                  "(ShardedVariable)",
                                  "use ps_shards=1 (whole variables are still spread over the ps tasks "
                                  "round-robin), or tf_keras with TF_USE_LEGACY_KERAS=1")
            if config.ps_shards > num_ps:
                raise ConfigError(config.sources.get("ps_shards", "default"), "ps_shards",
                                  f"{config.ps_shards} shards but only {num_ps} ps task(s)",
                                  f"use at most {num_ps}")
            partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=config.min_shard_bytes, max_shards=config.ps_shards)
        peers = ", ".join(f"{r}:{i} {a}" for r in ("worker", "ps") for i, a in enumerate(tf_config.cluster[r]))
        with deadline(config.collective_timeout, "connecting to the workers and parameter servers",
                      f"start every task of the cluster ({peers}) or raise --sync_collective_timeout"):
            strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
            self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        self.lost_workers = set()
        self.step_unit = None  # during fit: how a step's writes are made (tfsyncmodes.keras.once)
        super().__init__(config, strategy)

    @property
    def is_chief(self) -> bool:
        return True

    @property
    def num_workers(self) -> int:
        return self.cluster.num_tasks("worker")

    @property
    def num_replicas_in_sync(self) -> int:
        # Each worker applies its own updates: one replica per worker, none in step with another.
        return self.num_workers

    def per_replica_batch_size(self, global_batch_size: int) -> int:
        """Async workers each take whole batches: the batch size is per worker."""
        return global_batch_size

    def distribute_datasets_from_function(self, dataset_fn: Callable, options=None):
        """A per-worker dataset: `dataset_fn` runs on every worker with an input context."""
        return self.coordinator.create_per_worker_dataset(
            lambda: self._tf_strategy.distribute_datasets_from_function(dataset_fn, options))

    def required_callbacks(self) -> List:
        """None on the chief: a ``--sync_slow_worker`` is slowed in its own process (see serve)."""
        return []

    def join(self) -> None:
        """Waits for every scheduled step, and logs workers lost meanwhile (the coordinator
        runs their steps on the others)."""
        self.coordinator.join()
        for index, address in enumerate(self.cluster.cluster["worker"]):
            reachable = bool(probe(address))
            if index not in self.lost_workers and not reachable:
                self.lost_workers.add(index)
                logging.warning("worker:%d at %s was lost; its steps run on the other workers",
                                index, address)
            elif index in self.lost_workers and reachable:  # restarted (launch --max_restarts)
                self.lost_workers.discard(index)
                logging.warning("worker:%d at %s is back; the coordinator gives it steps again", index, address)

    def parameter_server_lost(self, error: Exception) -> JobFailure:
        """The failure to report when a parameter server stopped answering. A killed server's
        connections can close a moment before its listening socket does, so the probes go on
        for up to `LOST_PS_SECONDS` until one of them fails."""
        stop = time.monotonic() + LOST_PS_SECONDS
        while True:
            lost = [f"ps:{i} at {a}" for i, a in enumerate(self.cluster.cluster["ps"]) if not probe(a)]
            if lost or time.monotonic() >= stop:
                break
            time.sleep(0.1)
        return JobFailure(f"{', '.join(lost) or 'a parameter server'} is unreachable and training cannot "
                          f"go on ({type(error).__name__}); restart the cluster with the same --model_dir "
                          "to resume from the last finished epoch")

    def one_unit(self, writes: Callable, *values):
        """In a model's own ``train_step``, under ``fit``: ``writes(*values)`` as one unit on the
        parameter server when ``--sync_exactly_once`` is on (with one ps task), so that a
        worker lost during the step has it applied exactly once. `values` holds everything the
        writes (update, metrics, counters) take from the worker's computation: the gradients,
        targets and predictions, the batch's size. Otherwise ``writes(*values)``."""
        if self.step_unit is None:
            return writes(*values)
        return self.step_unit(writes, *values)

    def _checkpoint_copies_backup(self) -> bool:
        return True  # each weight read is a call to the servers; no chief callback changes one

    def _backup_writes(self):
        return None if compat.LEGACY else True  # tf_keras coordinates its own writers here

    def fit(self, model, dataset_fn, *, epochs=1, steps_per_epoch=None, callbacks=(), verbose=None,
            input_options=None):
        """tf_keras trains with ``model.fit`` (it supports this strategy); Keras 3 refuses it, so
        Keras 3 models train in tfsyncmodes' fit-like loop on the coordinator. Every worker's
        iterator is made with `input_options` (tf.distribute's default reads one batch ahead)."""
        callbacks = self.with_required_callbacks(callbacks)
        verbose = self.default_verbose() if verbose is None else verbose
        if compat.LEGACY:
            # tf_keras is an optional dependency: its loop is imported only when it is in use.
            from tfsyncmodes.keras.legacy_async import fit_legacy

            if self.config.steps_ahead:
                logging.warning("steps_ahead=%d is not applied under tf_keras: its model.fit "
                                "waits for every step at an epoch's end", self.config.steps_ahead)

            return fit_legacy(self, model, dataset_fn, epochs=epochs, steps_per_epoch=steps_per_epoch,
                              callbacks=callbacks, verbose=verbose, input_options=input_options)
        try:
            return fit_loop(model, CoordinatorRunner(self, dataset_fn, input_options), epochs=epochs,
                            steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=verbose)
        except _LOST_PEER_ERRORS as error:
            raise self.parameter_server_lost(error) from None
