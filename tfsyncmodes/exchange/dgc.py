"""Deep Gradient Compression's corrections for sync mode's Top-K (Lin et al., ICLR 2018):

- momentum correction with momentum factor masking (:class:`MomentumCorrection`, the memory
  registered as ``dgc``): each rank accumulates the momentum-corrected update, ``u = m * u + g``,
  ``v = v + u``, sends the Top-K of ``v``, and zeroes ``u`` and ``v`` at the entries it sent
  (``masking=False``, ``--sync_dgc_masking=false``: only ``v``; at full density the update is
  then SGD with momentum m, where masking makes it SGD without);
- local gradient clipping (:func:`local_clip`): each rank clips its gradient to the global norm
  ``clip_norm / sqrt(N)`` before it is accumulated, N the number of ranks;
- the sparsity warm-up (:class:`~tfsyncmodes.exchange.warmup.SparsityWarmup`).

With momentum correction the momentum lives in ``u``: the inner optimizer should be plain SGD
without momentum, as in DGC. With SGD(momentum > 0) the momentum is applied twice; with Adam
(or another adaptive optimizer) the sent update, already a momentum sum, is normalised again,
which trains but is not DGC: a warning says so when the optimizer is wrapped.

Composed with a quantizing Top-K (``topk_int2``) ``v`` keeps what quantization left out of the
sent entries (``v = v - sent``, 0 at the sent entries for plain Top-K), and ``u`` is zeroed
where entries were sent.
"""
from __future__ import annotations

import logging
import math

import tensorflow as tf

from tfsyncmodes.exchange.memory import Memory
from tfsyncmodes.exchange.staleness import ClipByGlobalNorm
from tfsyncmodes.registry import MEMORIES

log = logging.getLogger(__name__)


@MEMORIES.register("dgc")
class MomentumCorrection(Memory):
    """`momentum`: m of ``u = m * u + g`` (DGC's 0.9); `masking`: zero ``u`` where ``v`` was
    sent (DGC's momentum factor masking; off, ``u`` keeps its momentum)."""

    def __init__(self, momentum: float = 0.9, masking: bool = True):
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum {momentum}: use a value in [0, 1)")
        self.momentum = float(momentum)
        self.masking = bool(masking)
        self.velocity = self.accumulated = None
        self._velocity_now = None

    def attach(self, inner_optimizer) -> None:
        """Warns when the inner optimizer adds momentum (or adaptivity) of its own."""
        momentum = float(getattr(inner_optimizer, "momentum", 0.0) or 0.0)
        adaptive = hasattr(inner_optimizer, "beta_1")
        if momentum > 0.0 or adaptive:
            log.warning("DGC's momentum correction already accumulates momentum (%.3g); %s %s: "
                        "use plain SGD without momentum as DGC does", self.momentum,
                        type(inner_optimizer).__name__,
                        f"adds momentum {momentum:g} again" if momentum > 0.0 else "rescales the momentum sum")

    def build(self, ctx, state):
        self.velocity = state("dgc_velocity", list(ctx.shape), tf.float32)
        self.accumulated = state("dgc_accumulated", list(ctx.shape), tf.float32)

    def compensate(self, tensor, ctx):
        del ctx
        self._velocity_now = self.momentum * tf.convert_to_tensor(self.velocity) + tensor
        return tf.convert_to_tensor(self.accumulated) + self._velocity_now

    def update(self, compensated, payload, compressor, ctx):
        sent = compressor.decompress(payload, ctx)
        velocity = self._velocity_now
        if self.masking:
            velocity = velocity * (1.0 - compressor.sent_mask(payload, ctx))
        return tf.group(self.accumulated.assign(compensated - sent), self.velocity.assign(velocity))


def local_clip(clip_norm: float, ranks: int) -> ClipByGlobalNorm:
    """Clips each rank's gradient to the global norm ``clip_norm / sqrt(ranks)``, so that the
    sum over the ranks stays within about `clip_norm`."""
    return ClipByGlobalNorm(clip_norm / math.sqrt(max(1, ranks)))
