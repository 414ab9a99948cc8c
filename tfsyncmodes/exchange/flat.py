"""The model's tensors as one flat float32 vector, and the context a compressor gets.

Cross-group exchanges send one vector per step (one collective, one Top-K selection over all
entries). :class:`TensorContext` tells a compressor what that vector is made of (name, shape,
and the variables it concatenates, with their names and shapes), so a compressor may also
work per layer (matrix-shaped, chunked) by splitting it.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tfsyncmodes.exchange.base import densify


def num_elements(variable) -> int:
    return int(np.prod(tuple(variable.shape), dtype=np.int64))


@dataclasses.dataclass(frozen=True)
class TensorContext:
    """What a compressed tensor is: its name and shape, and the tensors it concatenates."""

    name: str
    shape: Tuple[int, ...]
    layers: Tuple["TensorContext", ...] = ()
    offset: int = 0  # where its entries start in the model's flat vector (a fragment's; 0: all of it)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def part(self, start: int, stop: int, name: str) -> "TensorContext":
        """The context of entries [start, stop) of this flat vector: a fragment of the model
        (a block of entries, which may cut a variable, so it names no layers)."""
        return TensorContext(name, (stop - start,), (), self.offset + start)

    @classmethod
    def of_variables(cls, variables: Sequence, name: str = "flat") -> "TensorContext":
        layers = tuple(cls(getattr(v, "path", None) or v.name, tuple(int(d) for d in v.shape))
                       for v in variables)
        return cls(name, (sum(layer.size for layer in layers),), layers)


def flatten(tensors: Sequence[Optional[tf.Tensor]], variables: Sequence) -> tf.Tensor:
    """One float32 vector of every tensor (``None``: zeros of its variable's shape)."""
    parts = []
    for tensor, variable in zip(tensors, variables):
        if tensor is None:
            parts.append(tf.zeros([num_elements(variable)], tf.float32))
        else:
            parts.append(tf.reshape(tf.cast(densify(tensor), tf.float32), [-1]))
    return tf.concat(parts, axis=0)


def flatten_variables(variables: Sequence) -> tf.Tensor:
    return flatten([tf.convert_to_tensor(v) for v in variables], variables)


def unflatten(flat: tf.Tensor, variables: Sequence) -> List[tf.Tensor]:
    sizes = [num_elements(v) for v in variables]
    return [tf.cast(tf.reshape(part, tuple(v.shape)), v.dtype)
            for part, v in zip(tf.split(flat, sizes), variables)]


def window(whole, ctx: Optional[TensorContext]) -> tf.Tensor:
    """The entries `ctx` (a fragment's context; None: all) covers of `whole`, a vector over the
    whole model (a memory's residual, an outer optimizer's momentum, the anchor)."""
    whole = tf.convert_to_tensor(whole)
    if ctx is None or (ctx.offset == 0 and ctx.size == whole.shape[0]):
        return whole
    return whole[ctx.offset:ctx.offset + ctx.size]


def with_window(whole, ctx: Optional[TensorContext], values: tf.Tensor) -> tf.Tensor:
    """`whole` with the entries `ctx` covers replaced by `values` (None: `values` is all of it)."""
    whole = tf.convert_to_tensor(whole)
    if ctx is None or (ctx.offset == 0 and ctx.size == whole.shape[0]):
        return values
    return tf.concat([whole[:ctx.offset], values, whole[ctx.offset + ctx.size:]], axis=0)


def assign_flat(variables: Sequence, flat: tf.Tensor) -> tf.Operation:
    """Sets `variables` from one flat vector."""
    return tf.group([v.assign(u) for v, u in zip(variables, unflatten(flat, variables))])
