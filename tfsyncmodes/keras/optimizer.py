"""``SyncOptimizer``: the Keras 3 optimizer that puts a mode's exchange around any Keras
optimizer's update.

Shaped like Keras's ``LossScaleOptimizer``: it owns an inner optimizer, builds it in
``build()``, forwards ``learning_rate`` and ``iterations`` to it, exposes its variables (and
the exchange's state, which it creates as its own variables), runs the exchange in
``apply()`` (:class:`~tfsyncmodes.keras.core.SyncCore`) and leaves the update itself to the
inner optimizer. ``get_config`` carries the inner optimizer and the knobs the exchange was
built with, so ``model.save`` / ``keras.models.load_model`` rebuild the same exchange with its
state.
"""
from __future__ import annotations

import keras

from tfsyncmodes.keras.core import SyncCore, SyncCoreAccess, saved_core, state_factory


@keras.saving.register_keras_serializable(package="tfsyncmodes")
class SyncOptimizer(SyncCoreAccess, keras.optimizers.Optimizer):
    """Wraps `inner_optimizer` so that its update goes through `core`'s exchange."""

    def __init__(self, inner_optimizer, core: SyncCore = None, name=None, **kwargs):
        if kwargs:
            raise ValueError(
                f"SyncOptimizer takes no optimizer arguments ({', '.join(kwargs)}); "
                "set them on the inner optimizer")
        if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
            raise TypeError(
                f"wrap() needs a Keras 3 optimizer, got {type(inner_optimizer).__name__}; "
                "with TF_USE_LEGACY_KERAS=1 pass a tf_keras optimizer")
        if core is None:  # constructed directly: the strategy's knobs, as wrap() takes them
            core = SyncCore.default()
        super().__init__(learning_rate=0.0, name=name or f"{core.mode}_{inner_optimizer.name}")
        self.inner_optimizer = inner_optimizer
        self._sync_core = core
        core.attach(inner_optimizer)

    def build(self, var_list):
        self.inner_optimizer.build(var_list)
        self._sync_core.build(var_list, state_factory(self.add_variable))
        super().build(var_list)

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        variables = trainable_variables or self._trainable_variables
        self._sync_core.apply(grads, variables, lambda g: self.inner_optimizer.apply(
            g, trainable_variables=trainable_variables))

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

    def get_config(self):
        return {
            "name": self.name,
            "tfsync_knobs": self._sync_core.get_config(),
            "inner_optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("inner_optimizer"), custom_objects=custom_objects)
        core = saved_core(config)
        return cls(inner, core=core, **config)


def wrap(optimizer, core: SyncCore) -> SyncOptimizer:
    """`optimizer` (a Keras 3 optimizer) wrapped around `core`'s exchange."""
    return SyncOptimizer(optimizer, core=core)
