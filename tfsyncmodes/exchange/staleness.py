"""Async mode's exchange: the remedies for stale gradients, each a small transform.

In async mode nothing crosses workers in the exchange itself (the parameter servers apply each
worker's update as it comes); what the chain does is temper updates that were computed on
old variables:

- :class:`ClipByGlobalNorm` bounds the size of any one update;
- :class:`StalenessScaling` multiplies an update by ``1 / (1 + staleness)``, where staleness
  is how many other updates landed between this worker's read of the variables and its write;
- :class:`InverseTimeDecay` multiplies by ``1 / (1 + decay * step)``.

The two scalings act on the gradient, which is the same as scaling the learning rate for SGD
with or without momentum, the optimizers async training uses; adaptive optimizers (Adam and
its kin) normalise such a scale away, so :func:`check_inner_optimizer` refuses them together.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange.base import GradientTransform, chain


@dataclasses.dataclass
class StepVersion:
    """Update counts seen by the step being traced: filled in by the optimizer."""

    read: Optional[tf.Tensor] = None      # applied updates when the worker read the variables
    current: Optional[tf.Tensor] = None   # applied updates when it is about to write

    @property
    def staleness(self) -> tf.Tensor:
        """Other updates that landed between this step's read and its write."""
        if self.read is None:
            return tf.zeros((), tf.int64)
        return tf.maximum(tf.cast(self.current - self.read, tf.int64), 0)


class ClipByGlobalNorm(GradientTransform):
    def __init__(self, clip_norm: float):
        self.clip_norm = clip_norm

    def __call__(self, grads, variables):
        present = [i for i, g in enumerate(grads) if g is not None]
        clipped, _ = tf.clip_by_global_norm([grads[i] for i in present], self.clip_norm)
        out = list(grads)
        for i, g in zip(present, clipped):
            out[i] = g
        return out


def _scale(grads, factor):
    return [None if g is None else g * tf.cast(factor, g.dtype) for g in grads]


class StalenessScaling(GradientTransform):
    """Scales an update by 1 / (1 + staleness)."""

    def __init__(self, version: StepVersion):
        self.version = version

    def __call__(self, grads, variables):
        return _scale(grads, 1.0 / (1.0 + tf.cast(self.version.staleness, tf.float32)))


class InverseTimeDecay(GradientTransform):
    """Scales an update by 1 / (1 + decay * applied_updates)."""

    def __init__(self, decay: float, version: StepVersion):
        self.decay = decay
        self.version = version

    def __call__(self, grads, variables):
        step = tf.cast(self.version.current, tf.float32)
        return _scale(grads, 1.0 / (1.0 + self.decay * step))


def async_exchange(config, version: Optional[StepVersion] = None) -> GradientTransform:
    """The remedies `config` switches on, in order: clip, then scale."""
    version = version if version is not None else StepVersion()
    parts = []
    if config.clip_norm > 0:
        parts.append(ClipByGlobalNorm(config.clip_norm))
    if config.staleness_aware_lr:
        parts.append(StalenessScaling(version))
    if config.lr_decay > 0:
        parts.append(InverseTimeDecay(config.lr_decay, version))
    return chain(*parts)


SCALE_INVARIANT = ("Adam", "AdamW", "Adamax", "Nadam", "Adagrad", "Adadelta", "RMSprop", "Lion",
                   "Adafactor", "Ftrl", "Lamb")


def check_inner_optimizer(config, optimizer) -> None:
    """Refuses gradient-scaling remedies with optimizers that normalise the scale away."""
    name = type(optimizer).__name__
    scaling = [flag for flag, on in (("staleness_aware_lr", config.staleness_aware_lr),
                                     ("lr_decay", config.lr_decay > 0)) if on]
    if scaling and name.removeprefix("Sync") in SCALE_INVARIANT:
        raise ConfigError(config.sources.get(scaling[0], "default"), scaling[0],
                          f"scales each update's gradient, which {name} normalises away",
                          "use keras.optimizers.SGD (with momentum if wanted) in async mode, "
                          f"or turn {scaling[0]} off")
