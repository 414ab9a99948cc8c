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

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

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


def assign_flat(variables: Sequence, flat: tf.Tensor) -> tf.Operation:
    """Sets `variables` from one flat vector."""
    return tf.group([v.assign(u) for v, u in zip(variables, unflatten(flat, variables))])
