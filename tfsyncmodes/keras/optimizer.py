"""``SyncOptimizer``: the Keras 3 optimizer that puts a mode's gradient exchange in front of
any Keras optimizer.

Shaped like Keras's ``LossScaleOptimizer``: it owns an inner optimizer, builds it in
``build()``, forwards ``learning_rate`` and ``iterations`` to it, exposes its variables, runs
the exchange in ``apply()`` and leaves the update itself to the inner optimizer. It serializes
the inner optimizer, so ``model.save`` / ``keras.models.load_model`` round-trip it.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tfsyncmodes import exchange
from tfsyncmodes.config import MODES, current
from tfsyncmodes.errors import ConfigError, one_of
from tfsyncmodes.exchange.staleness import StepVersion, check_inner_optimizer


def _make_counter_atomic(counter):
    """Keras 3 increments ``optimizer.iterations`` as read-add-assign, which loses increments
    when workers update it concurrently on a parameter server. This instance's increment
    becomes the variable's own atomic ``assign_add``."""

    def assign_add(value):
        return counter.value.assign_add(tf.cast(value, counter.value.dtype))

    counter.assign_add = assign_add


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
        self._sync_config = current()  # the run's knobs as they are when wrapped
        self._version = StepVersion()
        self.step_staleness = None
        if mode == "async":
            check_inner_optimizer(self._sync_config, inner_optimizer)
            _make_counter_atomic(inner_optimizer.iterations)

    def build(self, var_list):
        self.inner_optimizer.build(var_list)
        self._exchange = exchange.for_mode(self.mode, config=self._sync_config, version=self._version)
        self._exchange.build(var_list)
        super().build(var_list)

    def begin_step(self):
        """Records the applied-update count as this step reads the variables; the step's
        forward pass must depend on the returned tensor (async staleness)."""
        self._version.read = self.iterations.value.read_value()
        return self._version.read

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        variables = trainable_variables or self._trainable_variables
        if self.mode == "async":
            # Read once the gradients exist: updates landing while they were computed count.
            with tf.control_dependencies([g for g in grads if g is not None]):
                self._version.current = self.iterations.value.read_value()
        grads = self._exchange(list(grads), variables)
        self.inner_optimizer.apply(grads, trainable_variables=trainable_variables)
        if self.mode == "async":
            self.step_staleness = self._version.staleness
            self._version.read = self._version.current = None

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
