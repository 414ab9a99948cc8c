"""Sync over Horovod: one replica per ``horovodrun`` process, gradients averaged by
``SyncOptimizer`` with a grouped allreduce, no ``tf.distribute`` strategy underneath."""
from __future__ import annotations

from typing import List

import tensorflow as tf

from tfsyncmodes.config import SyncConfig, given_as
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange import communicators
from tfsyncmodes.keras.callbacks import BroadcastInitialState, MetricAverage
from tfsyncmodes.keras.hybrid_callbacks import WireTrafficLogger
from tfsyncmodes.keras.xla import XlaOffForCollectives
from tfsyncmodes.registry import BACKENDS
from tfsyncmodes.strategies import devices, elastic, horovod_start
from tfsyncmodes.strategies.base import ModeStrategy


def init_horovod(timeouts=None):
    """Imports and initialises Horovod, with a clear message when it is not installed;
    `timeouts`: see :func:`horovod_start.start`."""
    try:
        import horovod.tensorflow as hvd
    except ImportError as error:
        raise ConfigError("--sync_backend", "horovod",
                          f"Horovod is not importable ({error})",
                          "install it with scripts/install.sh") from None
    if not hvd.is_initialized():
        horovod_start.start(hvd, timeouts)
    return hvd


def _with_data_options(dataset: tf.data.Dataset, options) -> tf.data.Dataset:
    """`dataset` with `options` applied where they are a ``tf.data.Options``; a
    ``tf.distribute.InputOptions`` places a worker's replicas' batches, which a rank (one
    replica reading its own dataset) has none of."""
    return dataset.with_options(options) if isinstance(options, tf.data.Options) else dataset


@BACKENDS.register("horovod")
class HorovodStrategy(ModeStrategy):
    backend = "horovod"

    @classmethod
    def from_environment(cls, config, horovod, tf_config):
        if horovod is None:
            raise ConfigError(*given_as(config, "backend"), "horovod: this process was not started by horovodrun",
                              "launch with: horovodrun -np N python ...")
        return cls(config)

    def __init__(self, config: SyncConfig):
        # A peer that never arrives fails the job after the collective timeout instead of hanging
        # (an elastic job's rendezvous waits up to the join timeout: horovod_start).
        self.gloo_timeouts = horovod_start.gloo_timeouts(config)
        self.hvd = init_horovod(self.gloo_timeouts)
        # Each rank its local GPU (memory growth on), before TensorFlow initialises devices.
        self.device_plan = devices.place(devices.HOROVOD, self.hvd.local_rank(), self.hvd.local_size())
        super().__init__(config, tf.distribute.get_strategy())

    @property
    def num_replicas_in_sync(self) -> int:
        return self.hvd.size()

    @property
    def is_chief(self) -> bool:
        return self.hvd.rank() == 0

    @property
    def worker_index(self) -> int:
        return self.hvd.rank()

    @property
    def num_workers(self) -> int:
        return self.hvd.size()

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        """This rank's dataset: `dataset_fn` called with this rank's input context. `options`
        (``tf.distribute.InputOptions``) place and prefetch a worker's replicas' batches; a rank
        is one replica that reads its own dataset where it runs, so none of them applies (a
        ``tf.data.Options`` is applied to the dataset)."""
        return _with_data_options(dataset_fn(self.input_context()), options)

    def experimental_distribute_dataset(self, dataset, options=None):
        """Splits each global batch of `dataset` into equal per-replica pieces and keeps this
        rank's, as MirroredStrategy does with its replicas (`options`: as in
        :meth:`distribute_datasets_from_function`)."""
        batch = dataset.element_spec
        first = tf.nest.flatten(batch)[0]
        global_batch = first.shape[0] if first.shape.rank else None
        if global_batch is None:
            raise ValueError(
                "experimental_distribute_dataset under Horovod needs a static batch size: batch "
                "with drop_remainder=True, or use distribute_datasets_from_function")
        dataset = dataset.rebatch(self.per_replica_batch_size(global_batch)).shard(
            self.num_workers, self.worker_index)
        return _with_data_options(dataset, options)

    def reduce(self, reduce_op, value, axis=None):
        if axis is not None:
            value = tf.reduce_sum(value, axis=axis) if _is_sum(reduce_op) else tf.reduce_mean(value, axis=axis)
        return communicators.world_reduce(value, average=not _is_sum(reduce_op))

    def run(self, fn, args=(), kwargs=None):
        return fn(*args, **(kwargs or {}))

    def fit(self, model, dataset_fn, *, epochs=1, steps_per_epoch=None, callbacks=(), verbose=None,
            input_options=None):
        """As :meth:`ModeStrategy.fit`; with ``elastic`` on, through Horovod's elastic loop
        (:mod:`tfsyncmodes.strategies.elastic`). `input_options` apply to no rank (see
        :meth:`distribute_datasets_from_function`)."""
        if not self.config.elastic:
            return super().fit(model, dataset_fn, epochs=epochs, steps_per_epoch=steps_per_epoch,
                               callbacks=callbacks, verbose=verbose, input_options=input_options)
        return elastic.fit(self, model, dataset_fn, epochs=epochs, steps_per_epoch=steps_per_epoch,
                           callbacks=callbacks,
                           verbose=self.default_verbose() if verbose is None else verbose)

    # --- the elastic loop's hooks (tfsyncmodes.strategies.elastic) -----------------------------

    def elastic_restart(self, model) -> str:
        """Starts Horovod again after an elastic reset's shutdown; returns what the
        world-change line adds (nothing here)."""
        del model
        horovod_start.start(self.hvd, self.gloo_timeouts)
        return ""

    def elastic_commit_point(self, model) -> bool:
        """Whether the state may be committed after this step (every step is one in sync)."""
        del model
        return True

    def elastic_resized(self, model) -> None:
        """On every rank once the state of a new world is in place (nothing in sync)."""
        del model

    def elastic_part_epoch(self, model, steps: int, done: int) -> None:
        """A resumed epoch of `steps` steps begins, `done` of them run before (nothing in sync)."""
        del model, steps, done

    def _correctness_callbacks(self) -> List:
        # Traffic first, so that MetricAverage and History see it.
        traffic = [WireTrafficLogger()] if self._counts_traffic() else []
        return traffic + [XlaOffForCollectives(), BroadcastInitialState(root_rank=0), MetricAverage()]

    def _counts_traffic(self) -> bool:
        """Whether the exchange counts its bytes (a compressed one does)."""
        return self.config.compression != "none"


def _is_sum(reduce_op) -> bool:
    return str(getattr(reduce_op, "value", reduce_op)).upper() == "SUM"
