"""A compressor applied to each tensor of the flat vector on its own: hybrid's
``--sync_compression_per_tensor``.

The cross-group exchange sends the model as one flat vector (one collective a round, the
residual and the outer step over every entry). :class:`PerTensor` keeps that, and compresses
each of the vector's tensors (:attr:`TensorContext.layers
<tfsyncmodes.exchange.flat.TensorContext.layers>`) with its own scale or Top-K selection, as
INTELLECT-1 quantizes each tensor of its pseudo-gradient: a layer of small changes (a bias) is
not quantized on the scale of the largest one, nor left out of a Top-K selection that the large
layers fill. The payload is the tensors' payloads one after another; an allgather concatenates
each of its parts across ranks, and the inner compressor's ``decompress`` sums such
concatenations, so every tensor decompresses into the sum of the ranks' as before.

A context without tensors (a streaming fragment, a block of entries that may cut a variable)
is compressed whole. Sync's per-tensor exchange does not flatten at all
(:class:`~tfsyncmodes.exchange.compressed_allreduce.CompressedAllreduce` with ``per_tensor``).
"""
from __future__ import annotations

from typing import List, Tuple

import tensorflow as tf

from tfsyncmodes.exchange.compressors import Compressor, Payload
from tfsyncmodes.exchange.flat import TensorContext


class PerTensor(Compressor):
    """`inner` on each tensor of the vector a context describes (see the module doc)."""

    def __init__(self, inner: Compressor):
        self.inner = inner
        self.sparse = inner.sparse
        self.lossless = inner.lossless

    @property
    def selection(self):
        """The inner compressor's Top-K selection, if it has one (which implementation runs)."""
        return getattr(self.inner, "selection", None)

    @staticmethod
    def tensors(ctx: TensorContext) -> List[Tuple[int, TensorContext]]:
        """(offset, context) of each non-empty tensor of `ctx` ([(0, ctx)] when it names none)."""
        if not ctx.layers or sum(layer.size for layer in ctx.layers) != ctx.size:
            return [(0, ctx)]
        parts, offset = [], 0
        for i, layer in enumerate(ctx.layers):
            if layer.size:
                parts.append((offset, TensorContext(f"{ctx.name}.{i}", (layer.size,))))
            offset += layer.size
        return parts or [(0, ctx)]

    def _split(self, payload: Payload, ctx: TensorContext):
        """Each tensor's (context, payload) of a joined `payload`."""
        at = 0
        for _, part in self.tensors(ctx):
            count = len(self.inner.payload_spec(part))
            yield part, tuple(payload[at:at + count])
            at += count

    @staticmethod
    def _join(pieces) -> tf.Tensor:
        """One dense float32 vector of each tensor's (context, dense), in order (the tensors
        cover the vector: empty ones add nothing)."""
        parts = [tf.reshape(tf.cast(dense, tf.float32), [part.size]) for part, dense in pieces]
        return tf.concat(parts, 0) if len(parts) > 1 else parts[0]

    def compress(self, flat, ctx):
        payload: Tuple[tf.Tensor, ...] = ()
        for offset, part in self.tensors(ctx):
            payload += tuple(self.inner.compress(flat[offset:offset + part.size], part))
        return payload

    def decompress(self, payload, ctx):
        return self._join((part, self.inner.decompress(piece, part)) for part, piece in self._split(payload, ctx))

    def sent_mask(self, payload, ctx):
        return self._join((part, self.inner.sent_mask(piece, part)) for part, piece in self._split(payload, ctx))

    def payload_spec(self, ctx):
        return [spec for _, part in self.tensors(ctx) for spec in self.inner.payload_spec(part)]
