"""Error-feedback memory: what compression dropped this step is added back next step.

Without it, Top-K would never send the many small entries of a gradient, and they would be
lost for good; with it, they accumulate until they are large enough to be sent (Stich et al.,
"Sparsified SGD with memory"; Lin et al., "Deep Gradient Compression").

Contract (GRACE's): ``build(ctx, state)`` creates the memory's optimizer variables,
``compensate(tensor, ctx)`` adds back what was kept, ``update(compensated, payload,
compressor, ctx)`` keeps what `payload` left out. A new memory is a subclass with
``@MEMORIES.register("name")`` whose settings are its constructor's keyword arguments;
:func:`default_memory` is what a compressor gets when none is given.
"""
from __future__ import annotations

import tensorflow as tf

from tfsyncmodes.exchange.base import StateFactory
from tfsyncmodes.exchange.compressors import Compressor, Payload
from tfsyncmodes.exchange.flat import TensorContext, window, with_window
from tfsyncmodes.registry import MEMORIES


class Memory:
    """Base: the contract, with nothing remembered."""

    def build(self, ctx: TensorContext, state: StateFactory) -> None:
        del ctx, state

    def compensate(self, tensor: tf.Tensor, ctx: TensorContext) -> tf.Tensor:
        del ctx
        return tensor

    def update(self, compensated: tf.Tensor, payload: Payload, compressor: Compressor,
               ctx: TensorContext):
        """Remembers what `payload` (`compressor`'s output for `compensated`) left out."""
        del compensated, payload, compressor, ctx
        return tf.no_op()


@MEMORIES.register("none")
class NoMemory(Memory):
    """Nothing is remembered: dropped entries are lost."""


@MEMORIES.register("residual")
class ErrorFeedback(Memory):
    """Keeps the residual ``compensated - sent`` and adds it to the next update.

    For Top-K the residual is the compensated update with the sent entries zeroed, exactly:
    the sent values are copies of those entries, so their difference is 0, and every other
    entry is kept as it was. (Zeroing just those entries in place with a scatter measured
    slower on CPU than this one dense subtraction.) For a fragment of the model (`ctx` with an
    offset, as streaming averaging sends) it keeps and adds back that fragment's entries only.
    """

    def __init__(self):
        self.residual = None

    def build(self, ctx, state):
        self.residual = state("error_feedback_residual", list(ctx.shape), tf.float32)

    def compensate(self, tensor, ctx):
        return tensor + window(self.residual, ctx)

    def update(self, compensated, payload, compressor, ctx):
        sent = compressor.decompress(payload, ctx)
        return self.residual.assign(with_window(self.residual, ctx, compensated - sent))


def default_memory(compressor: Compressor) -> Memory:
    """Error feedback for a compressor that drops information, none for a lossless one (its
    residual would stay zero)."""
    return NoMemory() if compressor.lossless else ErrorFeedback()
