"""``SyncOptimizer``: the Keras 3 optimizer that puts a mode's gradient exchange in front of
any Keras optimizer.

Shaped like Keras's ``LossScaleOptimizer``: it owns an inner optimizer, builds it in
``build()``, forwards ``learning_rate`` and ``iterations`` to it, exposes its variables, runs
the exchange in ``apply()`` and leaves the update itself to the inner optimizer. It serializes
the inner optimizer, so ``model.save`` / ``keras.models.load_model`` round-trip it.
"""
from __future__ import annotations

import keras

from tfsyncmodes import exchange
from tfsyncmodes.config import MODES
from tfsyncmodes.errors import ConfigError, one_of


@keras.saving.register_keras_serializable(package="tfsyncmodes")
class SyncOptimizer(keras.optimizers.Optimizer):
    """Wraps `inner_optimizer` so that its gradients go through `mode`'s exchange first."""

    def __init__(self, inner_optimizer, mode="sync", name=None, **kwargs):
        if kwargs:
            raise ValueError(
                f"SyncOptimizer takes no optimizer arguments ({', '.join(kwargs)}); "
                "set them on the inner optimizer")
        if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
            raise TypeError(
                f"wrap() needs a Keras 3 optimizer, got {type(inner_optimizer).__name__}; "
                "with TF_USE_LEGACY_KERAS=1 pass a tf_keras optimizer")
        if mode not in MODES:
            raise ConfigError("wrap", "mode", f"{mode!r} is not accepted", one_of(MODES))
        super().__init__(learning_rate=0.0, name=name or f"{mode}_{inner_optimizer.name}")
        self.inner_optimizer = inner_optimizer
        self.mode = mode
        self._exchange = None

    def build(self, var_list):
        self.inner_optimizer.build(var_list)
        self._exchange = exchange.for_mode(self.mode)
        self._exchange.build(var_list)
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
        grads = self._exchange(list(grads), variables)
        self.inner_optimizer.apply(grads, trainable_variables=trainable_variables)

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
            "mode": self.mode,
            "inner_optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("inner_optimizer"), custom_objects=custom_objects)
        return cls(inner, **config)
