"""The version of the variables an async step reads and writes: the applied-update count.

:class:`StepVersion` is the first part of async mode's chain; the remedies that act on
staleness (:mod:`~tfsyncmodes.exchange.staleness`, :mod:`~tfsyncmodes.exchange.remedies`) read
it. The helpers here make an optimizer's or a metric's counter exact under concurrent workers.
"""
from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from tfsyncmodes.exchange.base import Part

# Optimizers that normalise a gradient's scale away (a scaled gradient gives the same step).
SCALE_INVARIANT = ("Adam", "AdamW", "Adamax", "Nadam", "Adagrad", "Adadelta", "RMSprop", "Lion",
                   "Adafactor", "Ftrl", "Lamb")


def normalises_gradient_scale(optimizer) -> bool:
    """Whether `optimizer` (a wrapper's ``Sync<Name>`` too) is one of :data:`SCALE_INVARIANT`."""
    return type(optimizer).__name__.removeprefix("Sync") in SCALE_INVARIANT


def tf_variable(counter) -> tf.Variable:
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
    variables (``begin_step``), ``current`` when it is about to write (``transform``).

    `check_optimizer(inner_optimizer)`, when given, runs at attach and raises if the chain's
    remedies cannot work with that optimizer (the async recipe's refuses gradient scaling
    with :data:`SCALE_INVARIANT` optimizers, naming the knob that turned it on).
    """

    def __init__(self, check_optimizer: Optional[Callable[[object], None]] = None):
        self.check_optimizer = check_optimizer
        self.iterations = None
        self.read: Optional[tf.Tensor] = None
        self.current: Optional[tf.Tensor] = None
        self._staleness = None

    def attach(self, inner_optimizer):
        if self.check_optimizer is not None:
            self.check_optimizer(inner_optimizer)
        self.iterations = inner_optimizer.iterations
        make_counter_atomic(self.iterations)

    def begin_step(self):
        self.read = tf_variable(self.iterations).read_value()
        return self.read

    def transform(self, grads, variables):
        if self.iterations is None:  # not attached to an optimizer: no count to read
            return grads
        # Read once the gradients exist: updates landing while they were computed count.
        with tf.control_dependencies([g for g in grads if g is not None]):
            self.current = tf_variable(self.iterations).read_value()
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
