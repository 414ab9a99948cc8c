"""Async mode's exchange: the remedies for stale gradients, each a small part.

In async mode nothing crosses workers in the exchange itself (the parameter servers apply each
worker's update as it comes); what the chain does is measure and temper updates that were
computed on old variables:

- :class:`~tfsyncmodes.exchange.version.StepVersion` records the applied-update count when the
  step reads the variables and when it writes, and makes that count exact (Keras 3's
  increment is not atomic);
- :class:`ClipByGlobalNorm` bounds the size of any one update;
- :class:`StalenessScaling` multiplies an update by ``1 / (1 + staleness)``, where staleness
  is how many other updates landed between this worker's read of the variables and its write;
- :class:`InverseTimeDecay` multiplies by ``1 / (1 + decay * step)``;
- :mod:`~tfsyncmodes.exchange.remedies` has the SSP drop (``max_staleness``) and DC-ASGD's
  delay compensation.

With SGD (with or without momentum) the two scalings act on the gradient, which is the same as
scaling the step's learning rate. Adaptive optimizers (Adam and its kin) normalise a gradient's
scale away, so with them the scalings scale the *update* instead: the step's learning rate
(:meth:`~tfsyncmodes.exchange.base.Part.update_scale`, applied by the optimizer wrapper for that
step only; the moments see the raw gradient). That is the staleness-aware learning rate of
Zhang et al. (IJCAI 2016) for any optimizer. The recipe
(:func:`tfsyncmodes.exchange.recipes.async_exchange`) puts them in order.
"""
from __future__ import annotations

import tensorflow as tf

from tfsyncmodes.exchange.base import Part
from tfsyncmodes.exchange.version import StepVersion, normalises_gradient_scale


class ClipByGlobalNorm(Part):
    """Clips the step's gradients together to the global norm `clip_norm`."""

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


class GradientScaling(Part):
    """Base of the parts that scale a step by :meth:`factor`: the gradient for an optimizer
    whose update is linear in it (SGD), the update (the step's learning rate) for one that
    normalises the gradient's scale away (Adam and its kin), decided when attached."""

    scales_update = False

    def attach(self, inner_optimizer):
        self.scales_update = normalises_gradient_scale(inner_optimizer)

    def factor(self) -> tf.Tensor:
        raise NotImplementedError

    def transform(self, grads, variables):
        return grads if self.scales_update else _scale(grads, self.factor())

    def update_scale(self):
        return self.factor() if self.scales_update else None


class StalenessScaling(GradientScaling):
    """Scales an update by 1 / (1 + staleness), the staleness `version` measured."""

    def __init__(self, version: StepVersion):
        self.version = version

    def factor(self):
        return 1.0 / (1.0 + tf.cast(self.version.staleness, tf.float32))


class InverseTimeDecay(GradientScaling):
    """Scales an update by 1 / (1 + decay * applied_updates), the count `version` read."""

    def __init__(self, decay: float, version: StepVersion):
        self.decay = decay
        self.version = version

    def factor(self):
        return 1.0 / (1.0 + self.decay * tf.cast(self.version.current, tf.float32))
