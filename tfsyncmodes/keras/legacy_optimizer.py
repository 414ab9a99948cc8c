"""The tf_keras (Keras 2, ``TF_USE_LEGACY_KERAS=1``) form of :class:`SyncOptimizer`.

tf_keras optimizers resolve much of their state through their own class, so, as Horovod's
Keras 2 glue does, the wrapper is a subclass of the inner optimizer's class that runs the
exchange in ``apply_gradients``. One such subclass is registered per built-in tf_keras
optimizer (``tfsyncmodes>SyncAdam`` …) so that ``tf_keras.models.load_model`` finds it.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras

from tfsyncmodes import exchange
from tfsyncmodes.config import MODES
from tfsyncmodes.errors import ConfigError, one_of
from tfsyncmodes.exchange.staleness import StepVersion, check_inner_optimizer

_CLASSES = {}


class _SyncMixin:
    """What every legacy Sync<Optimizer> adds to its base."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        variables = [v for _, v in grads_and_vars]
        grads = [g for g, _ in grads_and_vars]
        version = self._tfsync_version()
        if getattr(self, "_tfsync_exchange", None) is None:
            self._tfsync_exchange = exchange.for_mode(self.sync_mode, config=self._tfsync_knobs(),
                                                      version=version)
            self._tfsync_exchange.build(variables)
        if self.sync_mode == "async":
            with tf.control_dependencies([g for g in grads if g is not None]):
                version.current = self.iterations.read_value()
        grads = self._tfsync_exchange(grads, variables)
        result = super().apply_gradients(zip(grads, variables), *args, **kwargs)
        if self.sync_mode == "async":
            self.step_staleness = version.staleness
            version.read = version.current = None
        return result

    def begin_step(self):
        """Records the applied-update count as the step reads the variables (async)."""
        version = self._tfsync_version()
        version.read = self.iterations.read_value()
        return version.read

    def _tfsync_knobs(self):
        """The run's knobs as they were when the optimizer was wrapped or loaded."""
        if getattr(self, "_tfsync_config", None) is None:
            from tfsyncmodes.config import current

            self._tfsync_config = current()
        return self._tfsync_config

    def _tfsync_version(self) -> StepVersion:
        if getattr(self, "_tfsync_step_version", None) is None:
            self._tfsync_step_version = StepVersion()
        return self._tfsync_step_version

    def get_config(self):
        config = super().get_config()
        config["sync_mode"] = self.sync_mode
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        mode = config.pop("sync_mode", "sync")
        optimizer = super().from_config(config, custom_objects=custom_objects)
        optimizer.sync_mode = mode
        optimizer._tfsync_knobs()  # the knobs in force now, as Keras 3's wrapper takes them
        return optimizer


def _sync_class(base: type) -> type:
    if base not in _CLASSES:
        cls = type(f"Sync{base.__name__}", (_SyncMixin, base), {"__module__": __name__})
        _CLASSES[base] = tf_keras.saving.register_keras_serializable(package="tfsyncmodes")(cls)
    return _CLASSES[base]


for _name in ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "Nadam", "Ftrl", "Lion"):
    if hasattr(tf_keras.optimizers, _name):
        _sync_class(getattr(tf_keras.optimizers, _name))


def wrap(optimizer, mode: str):
    if not isinstance(optimizer, tf_keras.optimizers.Optimizer):
        raise TypeError(
            f"with TF_USE_LEGACY_KERAS=1 wrap() needs a tf_keras optimizer, got "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}")
    if mode not in MODES:
        raise ConfigError("wrap", "mode", f"{mode!r} is not accepted", one_of(MODES))
    if isinstance(optimizer, _SyncMixin):
        raise ValueError("this optimizer is already wrapped by tfsyncmodes")
    wrapped = _sync_class(type(optimizer)).from_config(optimizer.get_config())
    wrapped.sync_mode = mode
    if mode == "async":
        check_inner_optimizer(wrapped._tfsync_knobs(), optimizer)
    return wrapped
