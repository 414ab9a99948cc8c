"""Two more remedies for async mode's stale updates, parts of async mode's chain.

- :class:`StaleUpdateDrop` (``--sync_max_staleness=S``): the bounded staleness of SSP, the Stale
  Synchronous Parallel model (Ho et al., NIPS 2013, "More Effective Distributed ML via a Stale
  Synchronous Parallel Parameter Server"). SSP keeps a fast worker from running more than S
  clocks ahead of the slowest by making it wait; a parameter-server update that arrives staler
  than S cannot be waited for any more, so here it is *dropped*: its gradient is scaled to zero.
  Staleness is :attr:`~tfsyncmodes.exchange.version.StepVersion.staleness`, the number of updates that landed between this
  worker's read of the variables and its write. Every dropped update is counted in an
  optimizer variable (so on the parameter servers, with the variable's own atomic
  ``assign_add``, exact under concurrent workers, and saved with checkpoints); the training
  loops report the epoch's count as ``dropped_updates``.

  What a drop does is what a zero gradient does to the inner optimizer, said plainly:

  * plain SGD: the weights do not change;
  * SGD with momentum (Keras: ``v <- mu * v - lr * g``; ``w <- w + v``): the stale gradient
    contributes nothing, but the step still moves ``w`` by the decayed velocity ``mu * v`` of
    the updates accepted before (as if the worker had sent a zero gradient), and ``v`` decays;
  * adaptive optimizers likewise still step on their moment estimates.

  A dropped update still counts in ``optimizer.iterations`` (the step ran; learning-rate
  schedules, checkpoints and the loops count steps), so it is one of the updates that make
  later ones stale. Skipping the inner update altogether would need a conditional around
  the inner optimizer's update, which its distributed update paths do not support inside a
  worker's step.

- :class:`DelayCompensation` (``--sync_delay_compensation=LAMBDA``): DC-ASGD (Zheng et al., ICML
  2017, arXiv 1609.08326). A gradient ``g`` computed on the weights ``w_read`` but applied to
  ``w_now`` is corrected with the first-order Taylor term of the gradient, the Hessian
  approximated by ``lambda * g * g`` (the outer product of the gradient, diagonal only):
  ``g + lambda * g * g * (w_now - w_read)``. This is the paper's constant variant DC-ASGD-c;
  the authors use lambda_0 = 0.04 for it (MXNet's ``DCASGD`` default too) and lambda_0 = 2 for
  the adaptive variant DC-ASGD-a, which divides lambda by the root of a moving average
  (m = 0.95) of ``g * g``; that variant is not built here (its average would be state shared
  by all workers on the parameter servers, updated read-modify-write). ``w_read`` is read at
  ``begin_step``, before the forward pass; ``w_now`` once the gradients exist. Both are reads of
  the parameter servers over the network, variable by variable, so an update landing while
  the step reads can mix versions (as the forward pass's own reads can); DC costs one more
  read of every variable per step.
"""
from __future__ import annotations

from typing import Dict, Optional

import tensorflow as tf

from tfsyncmodes.exchange.base import Part, densify
from tfsyncmodes.exchange.version import StepVersion, tf_variable


def _read(variable) -> tf.Tensor:
    return tf.identity(tf_variable(variable).read_value())


class DelayCompensation(Part):
    """DC-ASGD-c: ``g + lam * g * g * (w_now - w_read)``; `lam` > 0 (the paper's 0.04)."""

    def __init__(self, lam: float):
        self.lam = lam
        self.variables = ()
        self.read: Optional[Dict[int, tf.Tensor]] = None

    def build(self, variables, state):
        del state
        self.variables = list(variables)

    def begin_step(self):
        if not self.variables:
            return None
        self.read = {id(v): _read(v) for v in self.variables}
        return tf.group(list(self.read.values()))

    def transform(self, grads, variables):
        if self.read is None:  # no begin_step in this step: nothing to compensate against
            return grads
        with tf.control_dependencies([g for g in grads if g is not None]):
            now = [None if g is None else _read(v) for g, v in zip(grads, variables)]
        out = []
        for g, v, w_now in zip(grads, variables, now):
            if g is None:
                out.append(None)
                continue
            if id(v) not in self.read:
                raise ValueError(f"delay_compensation: {getattr(v, 'name', v)} was not among the "
                                 "variables the optimizer was built with")
            g = densify(g)
            w_read = tf.cast(self.read[id(v)], g.dtype)
            out.append(g + self.lam * g * g * (tf.cast(w_now, g.dtype) - w_read))
        return out

    def after_update(self, variables):
        self.read = None


class StaleUpdateDrop(Part):
    """SSP bound: an update staler than `max_staleness` (as `version` measured it) contributes
    a zero gradient and is counted in ``dropped`` (an optimizer variable, atomic on the
    parameter servers)."""

    def __init__(self, max_staleness: int, version: StepVersion):
        self.max_staleness = max_staleness
        self.version = version
        self.dropped = None  # total dropped updates, created in build
        self._step_dropped = None

    def build(self, variables, state):
        del variables
        self.dropped = state("dropped_updates", (), tf.int64)

    def transform(self, grads, variables):
        drop = self.version.staleness > self.max_staleness
        keep = 1.0 - tf.cast(drop, tf.float32)
        counted = tf_variable(self.dropped).assign_add(tf.cast(drop, tf.int64), read_value=False) \
            if self.dropped is not None else None
        deps = [counted] if counted is not None else []
        with tf.control_dependencies(deps):
            self._step_dropped = tf.cast(drop, tf.int64)
            return [None if g is None else g * tf.cast(keep, g.dtype) for g in grads]

    def step_logs(self):
        value = self._step_dropped if self._step_dropped is not None else tf.zeros((), tf.int64)
        return {"dropped": value}


def dropped_counter(optimizer):
    """The variable counting `optimizer`'s dropped updates, or None when no bound is set."""
    exchange = getattr(optimizer, "exchange", None)
    parts = exchange.find(StaleUpdateDrop) if exchange is not None else []
    return parts[0].dropped if parts else None
