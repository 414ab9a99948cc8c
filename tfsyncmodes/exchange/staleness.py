"""Async mode's exchange: the remedies for stale gradients, each a small part.

In async mode nothing crosses workers in the exchange itself (the parameter servers apply each
worker's update as it comes); what the chain does is measure and temper updates that were
computed on old variables:

- :class:`StepVersion` records the applied-update count when the step reads the variables
  and when it writes, and makes that count exact (Keras 3's increment is not atomic);
- :class:`ClipByGlobalNorm` bounds the size of any one update;
- :class:`StalenessScaling` multiplies an update by ``1 / (1 + staleness)``, where staleness
  is how many other updates landed between this worker's read of the variables and its write;
- :class:`InverseTimeDecay` multiplies by ``1 / (1 + decay * step)``;
- :mod:`~tfsyncmodes.exchange.remedies` has the SSP drop (``max_staleness``) and DC-ASGD's
  delay compensation (``delay_compensation``).

The two scalings act on the gradient, which is the same as scaling the learning rate for SGD
with or without momentum, the optimizers async training uses; adaptive optimizers (Adam and
its kin) normalise such a scale away, so :func:`check_inner_optimizer` refuses them together.
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange.base import Chain, Part


def _variable(counter) -> tf.Variable:
    """The tf.Variable behind a Keras 3 variable (or the tf_keras variable itself)."""
    return counter if isinstance(counter, tf.Variable) else counter.value


def make_counter_atomic(counter) -> None:
    """Keras 3 increments ``optimizer.iterations`` as read-add-assign, which loses increments
    when workers update it concurrently on a parameter server. This instance's increment
    becomes the variable's own atomic ``assign_add`` (tf_keras' already is)."""
    if isinstance(counter, tf.Variable):
        return

    def assign_add(value):
        return counter.value.assign_add(tf.cast(value, counter.value.dtype))

    counter.assign_add = assign_add


class StepVersion(Part):
    """Update counts seen by the step being traced: ``read`` when the worker read the
    variables (``begin_step``), ``current`` when it is about to write (``transform``)."""

    def __init__(self, config):
        self.config = config
        self.iterations = None
        self.read: Optional[tf.Tensor] = None
        self.current: Optional[tf.Tensor] = None
        self._staleness = None

    def attach(self, inner_optimizer):
        check_inner_optimizer(self.config, inner_optimizer)
        self.iterations = inner_optimizer.iterations
        make_counter_atomic(self.iterations)

    def begin_step(self):
        self.read = _variable(self.iterations).read_value()
        return self.read

    def transform(self, grads, variables):
        if self.iterations is None:  # not attached to an optimizer: no count to read
            return grads
        # Read once the gradients exist: updates landing while they were computed count.
        with tf.control_dependencies([g for g in grads if g is not None]):
            self.current = _variable(self.iterations).read_value()
        return grads

    @property
    def staleness(self) -> tf.Tensor:
        """Other updates that landed between this step's read and its write."""
        if self.read is None or self.current is None:
            return tf.zeros((), tf.int64)
        return tf.maximum(tf.cast(self.current - self.read, tf.int64), 0)

    def after_update(self, variables):
        self._staleness = self.staleness
        self.read = self.current = None

    def step_logs(self):
        return {"staleness": self._staleness if self._staleness is not None else tf.zeros((), tf.int64)}


class ClipByGlobalNorm(Part):
    def __init__(self, clip_norm: float):
        self.clip_norm = clip_norm

    def transform(self, grads, variables):
        present = [i for i, g in enumerate(grads) if g is not None]
        clipped, _ = tf.clip_by_global_norm([grads[i] for i in present], self.clip_norm)
        out = list(grads)
        for i, g in zip(present, clipped):
            out[i] = g
        return out


def _scale(grads, factor):
    return [None if g is None else g * tf.cast(factor, g.dtype) for g in grads]


class StalenessScaling(Part):
    """Scales an update by 1 / (1 + staleness)."""

    def __init__(self, version: StepVersion):
        self.version = version

    def transform(self, grads, variables):
        return _scale(grads, 1.0 / (1.0 + tf.cast(self.version.staleness, tf.float32)))


class InverseTimeDecay(Part):
    """Scales an update by 1 / (1 + decay * applied_updates)."""

    def __init__(self, decay: float, version: StepVersion):
        self.decay = decay
        self.version = version

    def transform(self, grads, variables):
        step = tf.cast(self.version.current, tf.float32)
        return _scale(grads, 1.0 / (1.0 + self.decay * step))


def async_exchange(config, version: Optional[StepVersion] = None) -> Chain:
    """The version record, then the remedies `config` switches on, in this order:

    1. delay compensation (DC-ASGD): it estimates the gradient at the weights the update is
       applied to, so every later remedy acts on that estimate, as on a fresh gradient;
    2. clip by global norm: bounds what is applied, compensation term included;
    3. the SSP drop (``max_staleness``): an update staler than the bound becomes zero;
    4. the scalings, 1/(1+staleness) then inverse-time decay (products, so their order and
       the drop's do not change the result);

    then the inner optimizer's update (momentum acts on the gradient the chain hands it).
    """
    from tfsyncmodes.exchange.remedies import DelayCompensation, StaleUpdateDrop

    version = version if version is not None else StepVersion(config)
    parts = [version]
    if config.delay_compensation != "off":
        parts.append(DelayCompensation(config.delay_compensation))
    if config.clip_norm != "off":
        parts.append(ClipByGlobalNorm(config.clip_norm))
    if config.max_staleness != "off":
        parts.append(StaleUpdateDrop(config.max_staleness, version))
    if config.staleness_aware_lr:
        parts.append(StalenessScaling(version))
    if config.lr_decay != "off":
        parts.append(InverseTimeDecay(config.lr_decay, version))
    return Chain(*parts)


SCALE_INVARIANT = ("Adam", "AdamW", "Adamax", "Nadam", "Adagrad", "Adadelta", "RMSprop", "Lion",
                   "Adafactor", "Ftrl", "Lamb")


def check_inner_optimizer(config, optimizer) -> None:
    """Refuses gradient-scaling remedies with optimizers that normalise the scale away."""
    name = type(optimizer).__name__
    scaling = [flag for flag, on in (("staleness_aware_lr", config.staleness_aware_lr),
                                     ("lr_decay", config.lr_decay != "off")) if on]
    if scaling and name.removeprefix("Sync") in SCALE_INVARIANT:
        raise ConfigError(config.sources.get(scaling[0], "default"), scaling[0],
                          f"scales each update's gradient, which {name} normalises away",
                          "use keras.optimizers.SGD (with momentum if wanted) in async mode, "
                          f"or turn {scaling[0]} off")
