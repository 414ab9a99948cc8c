"""The contract every part of a mode's exchange follows, and the chain that runs them.

The optimizer wrapper (:mod:`tfsyncmodes.keras.core`) drives one :class:`Exchange` per
optimizer through these stages, each a method of :class:`Part` that does nothing by default:

=================  ===========================================================================
``attach(inner)``  once, at wrap time: check or adapt the inner optimizer (async: atomic counter)
``build(vs, st)``  once, before the first step: create state with ``st(name, shape, dtype)``,
                   which makes *optimizer variables* (so checkpoints, ``model.save`` and the
                   initial broadcast carry it)
``begin_step()``   in the step, before the forward pass (async: which version it reads)
``transform``      ``(grads, variables) -> grads``, before the inner update (clip, compress,
                   exchange, decompress)
``before_update``  ``(variables)``, just before the inner update
``after_update``   ``(variables)``, after the inner update: model averaging stages act here
``flush/finish``   eagerly, at the end of training (drain background rounds, final mean)
=================  ===========================================================================

A mode's exchange is a :class:`Chain` of parts, in order; as in optax, a technique is a part,
never a branch in a central function.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import tensorflow as tf

Grads = List[Optional[tf.Tensor]]
# state(name, shape, dtype) -> a new optimizer variable, zero-initialised.
StateFactory = Callable[[str, Sequence[int], tf.DType], tf.Variable]


def reuse_state(existing, what: str) -> StateFactory:
    """A state factory that hands back `existing` ((name, variable) pairs, in the order a build
    asks for them): an exchange rebuilt over other groups or after a switch keeps its variables.
    A build that asks for another name is a RuntimeError naming `what` (never StopIteration: in
    a Keras callback that ends the epoch as if the data had run out)."""
    remaining = iter(existing)

    def reuse(name, shape, dtype):
        del shape, dtype
        known, variable = next(remaining, (None, None))
        if known != name:
            raise RuntimeError(f"the {what} asks for {name!r}, not {known!r}")
        return variable
    return reuse


class Part:
    """One part of an exchange. Every stage defaults to doing nothing."""

    def attach(self, inner_optimizer) -> None:
        del inner_optimizer

    def build(self, variables: Sequence, state: StateFactory) -> None:
        del variables, state

    def begin_step(self) -> Optional[tf.Tensor]:
        return None

    def transform(self, grads: Grads, variables: Sequence) -> Grads:
        del variables
        return grads

    def __call__(self, grads: Grads, variables: Sequence) -> Grads:
        return self.transform(grads, variables)

    def before_update(self, variables: Sequence) -> None:
        del variables

    def update_scale(self) -> Optional[tf.Tensor]:
        """A factor for this step's update (the inner optimizer's learning rate for the step),
        after :meth:`transform`; None: the update as the optimizer makes it."""
        return None

    def after_update(self, variables: Sequence) -> None:
        del variables

    def step_logs(self) -> Dict[str, tf.Tensor]:
        """Tensors of the step just traced that the training loop adds to its logs."""
        return {}

    def flush(self) -> None:
        pass

    def finish(self, variables: Sequence) -> None:
        del variables

    def parts(self) -> List["Part"]:
        """This part and the parts inside it, depth first."""
        return [self]


class Chain(Part):
    """Runs its parts' stages in order (``transform`` feeds each part's output to the next)."""

    def __init__(self, *parts: Part):
        self.members = parts

    def attach(self, inner_optimizer):
        for part in self.members:
            part.attach(inner_optimizer)

    def build(self, variables, state):
        for part in self.members:
            part.build(variables, state)

    def begin_step(self):
        reads = [r for r in (part.begin_step() for part in self.members) if r is not None]
        return reads[0] if len(reads) == 1 else (tf.group(reads) if reads else None)

    def transform(self, grads, variables):
        for part in self.members:
            grads = part.transform(grads, variables)
        return grads

    def before_update(self, variables):
        for part in self.members:
            part.before_update(variables)

    def update_scale(self):
        scales = [s for s in (part.update_scale() for part in self.members) if s is not None]
        if not scales:
            return None
        product = scales[0]
        for scale in scales[1:]:
            product = product * scale
        return product

    def after_update(self, variables):
        for part in self.members:
            part.after_update(variables)

    def step_logs(self):
        logs = {}
        for part in self.members:
            logs.update(part.step_logs())
        return logs

    def flush(self):
        for part in self.members:
            part.flush()

    def finish(self, variables):
        for part in self.members:
            part.finish(variables)

    def parts(self):
        return [self] + [p for part in self.members for p in part.parts()]

    def find(self, kind: type) -> List[Part]:
        """The parts of type `kind` in this chain (e.g. for callbacks that log them)."""
        return [p for p in self.parts() if isinstance(p, kind)]


Exchange = Chain  # what a wrapped optimizer runs: a Chain of parts


def densify(grad):
    """IndexedSlices (embedding gradients) become dense tensors; None stays None."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)
    return grad


def optimizer_variables(optimizer) -> List:
    """An optimizer's variables as a list: Keras 3 and tf_keras' property, or the older
    optimizers' method; none for no optimizer."""
    variables = getattr(optimizer, "variables", ()) if optimizer is not None else ()
    return list((variables() if callable(variables) else variables) or ())
