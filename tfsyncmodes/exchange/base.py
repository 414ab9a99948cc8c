"""The gradient-exchange pipeline: small transforms chained per mode.

Each part is a :class:`GradientTransform`: ``build(variables)`` once (where it may create
state such as error-feedback memory), then ``__call__(grads, variables) -> grads`` every step
inside the training function. A mode's exchange is ``chain(...)`` of such parts; adding a
technique is adding a part, never a branch in a central function.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import tensorflow as tf


class GradientTransform:
    """One step of the exchange path. The default is the identity."""

    def build(self, variables: Sequence[tf.Variable]) -> None:
        del variables

    def __call__(self, grads: List[Optional[tf.Tensor]], variables: Sequence) -> List[Optional[tf.Tensor]]:
        del variables
        return grads


class Chain(GradientTransform):
    """Applies its parts in order."""

    def __init__(self, *parts: GradientTransform):
        self.parts = parts

    def build(self, variables):
        for part in self.parts:
            part.build(variables)

    def __call__(self, grads, variables):
        for part in self.parts:
            grads = part(grads, variables)
        return grads


def chain(*parts: GradientTransform) -> GradientTransform:
    return Chain(*parts)


def densify(grad):
    """IndexedSlices (embedding gradients) become dense tensors; None stays None."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)
    return grad
