"""The tf_keras (Keras 2, ``TF_USE_LEGACY_KERAS=1``) form of :class:`SyncOptimizer`.

tf_keras optimizers resolve much of their state through their own class, so, as Horovod's
Keras 2 glue does, the wrapper is a subclass of the inner optimizer's class that runs the
exchange (:class:`~tfsyncmodes.keras.core.SyncCore`, shared with the Keras 3 wrapper) in
``apply_gradients`` and creates the exchange's state with the optimizer's own
``add_variable``. One such subclass is registered per built-in tf_keras optimizer
(``tfsyncmodes>SyncAdam`` …) so that ``tf_keras.models.load_model`` finds it.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras

from tfsyncmodes.keras.core import SyncCore, SyncCoreAccess, saved_core, state_factory

_CLASSES = {}


class _SyncMixin(SyncCoreAccess):
    """What every legacy Sync<Optimizer> adds to its base."""

    def _tfsync_attach(self, core: SyncCore) -> None:
        self._sync_core = core
        core.attach(self)

    @property
    def sync_mode(self) -> str:
        return self.mode

    def build(self, var_list):
        if getattr(self, "_built", False):
            return
        super().build(var_list)
        self._sync_core.build(var_list, state_factory(self.add_variable))

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        variables = [v for _, v in grads_and_vars]
        with tf.init_scope():
            self.build(variables)
        return self._sync_core.apply([g for g, _ in grads_and_vars], variables, lambda grads: super(
            _SyncMixin, self).apply_gradients(zip(grads, variables), *args, **kwargs))

    def get_config(self):
        config = super().get_config()
        config["tfsync_knobs"] = self._sync_core.get_config()
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        core = saved_core(config)
        optimizer = super().from_config(config, custom_objects=custom_objects)
        if core is not None:
            optimizer._tfsync_attach(core)
        return optimizer


def _sync_class(base: type) -> type:
    if base not in _CLASSES:
        cls = type(f"Sync{base.__name__}", (_SyncMixin, base), {"__module__": __name__})
        _CLASSES[base] = tf_keras.saving.register_keras_serializable(package="tfsyncmodes")(cls)
    return _CLASSES[base]


for _name in ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "Nadam", "Ftrl", "Lion"):
    if hasattr(tf_keras.optimizers, _name):
        _sync_class(getattr(tf_keras.optimizers, _name))


def wrap(optimizer, core: SyncCore):
    if not isinstance(optimizer, tf_keras.optimizers.Optimizer):
        raise TypeError(
            f"with TF_USE_LEGACY_KERAS=1 wrap() needs a tf_keras optimizer, got "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}")
    if isinstance(optimizer, _SyncMixin):
        raise ValueError("this optimizer is already wrapped by tfsyncmodes")
    wrapped = _sync_class(type(optimizer)).from_config(optimizer.get_config())
    wrapped._tfsync_attach(core)
    return wrapped
