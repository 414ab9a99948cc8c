"""Outer optimizers: how a model-averaging policy applies the groups' mean change since the last
round (``--sync_outer_optimizer``), as in DiLoCo (Douillard et al., 2023): the *pseudo-gradient*
``anchor - averaged model`` goes to an ordinary optimizer step on the anchor.

Contract: ``build(ctx, state)`` creates the optimizer's state (optimizer variables, so
checkpoints carry the momentum); ``step(anchor, mean_change, ctx=None) -> new anchor``, where
`ctx` is a fragment's context when a streaming policy applies one fragment of the model (its
state for those entries only: per-fragment momentum); its settings are
its constructor's keyword arguments. A new one is a class here with
``@OUTER_OPTIMIZERS.register("name")``.
"""
from __future__ import annotations

import tensorflow as tf

from tfsyncmodes.exchange.flat import window, with_window
from tfsyncmodes.registry import OUTER_OPTIMIZERS

DILOCO_PERIOD = 500  # inner steps per round DiLoCo's outer settings (lr 0.7, momentum 0.9) were tuned at


def momentum_for_period(period: int) -> float:
    """The Nesterov outer momentum for rounds of `period` inner steps: DiLoCo's 0.9 from
    ``DILOCO_PERIOD`` on; 0.3 for shorter rounds, where 0.9 keeps pushing along directions the
    inner optimizer has already taken (digits, 4 ranks in 2 groups, Adam inside, 5 epochs, test
    accuracy against sync's 0.983 / 0.964 over two seeds: at period 8, momentum 0.9 reached
    0.917 / 0.900 and 0.3 reached 0.978 / 0.964; at period 32, 0.9 reached 0.964 / 0.953 and
    0.3 0.981 / 0.961). With the outer lr 0.7, 0.3 makes the effective outer step
    lr / (1 - momentum) 1.0, plain averaging's, plus Nesterov's look-ahead."""
    return 0.9 if period >= DILOCO_PERIOD else 0.3


@OUTER_OPTIMIZERS.register("average")
class AverageOuter:
    """``anchor + lr * mean_change``; with `lr` 1 (its default) plain averaging."""

    def __init__(self, lr: float = 1.0):
        self.lr = lr

    def build(self, ctx, state) -> None:
        del ctx, state

    def step(self, anchor: tf.Tensor, mean_change: tf.Tensor, ctx=None) -> tf.Tensor:
        del ctx
        return anchor + self.lr * mean_change


@OUTER_OPTIMIZERS.register("nesterov")
class NesterovOuter(AverageOuter):
    """SGD with Nesterov momentum on the pseudo-gradient g = -mean_change, as PyTorch's SGD
    computes it: ``v = momentum * v + g``, ``anchor - lr * (g + momentum * v)``. DiLoCo's
    settings are the defaults: `lr` 0.7, `momentum` 0.9. A fragment (`ctx`) moves with its own
    entries of the velocity."""

    def __init__(self, lr: float = 0.7, momentum: float = 0.9):
        super().__init__(lr)
        self.momentum = momentum
        self.velocity = None

    def build(self, ctx, state):
        self.velocity = state("outer_nesterov_velocity", list(ctx.shape), tf.float32)

    def step(self, anchor, mean_change, ctx=None):
        pseudo_gradient = -mean_change
        velocity = self.momentum * window(self.velocity, ctx) + pseudo_gradient
        self.velocity.assign(with_window(self.velocity, ctx, velocity))
        return anchor - self.lr * (pseudo_gradient + self.momentum * velocity)
