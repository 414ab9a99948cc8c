"""Compressors: what an update looks like on the wire.

Contract (GRACE's, with types): ``compress(tensor, ctx) -> payload`` (a tuple of tensors) and
``decompress(payload, ctx) -> tensor``, where ``ctx`` is the
:class:`~tfsyncmodes.exchange.flat.TensorContext` of the tensor (name, shape, and the layers it
concatenates, for a compressor that works per layer); ``payload_spec(ctx)`` gives the payload's
dtypes and shapes; ``sparse`` says that payloads differ in their indices, so the communicator
must allgather them rather than allreduce; ``lossless`` that no error feedback is needed. A
compressor knows nothing of memory or communication (see :mod:`~tfsyncmodes.exchange.memory`
and :mod:`~tfsyncmodes.exchange.communicators`). ``decompress`` sums entries that share an
index, so the concatenation of several ranks' Top-K payloads decompresses to the sum of their
updates: that is how an allgather of sparse payloads is reduced.

A new compressor: a subclass here (or in a module of its own) with
``@COMPRESSORS.register("name")``; ``--compression=name`` then selects it. Its constructor
takes the run's config.
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import tensorflow as tf

from tfsyncmodes.exchange.flat import TensorContext
from tfsyncmodes.registry import COMPRESSORS

Payload = Tuple[tf.Tensor, ...]


def payload_bytes(payload: Sequence[tf.Tensor]) -> tf.Tensor:
    """Bytes the payload's tensors occupy on the wire, from their real sizes and dtypes."""
    return tf.add_n([tf.size(t, out_type=tf.int64) * t.dtype.size for t in payload])


@COMPRESSORS.register("none")
class Compressor:
    """Identity: the update travels as float32."""

    sparse = False
    lossless = True

    def __init__(self, config=None):
        del config

    def compress(self, flat: tf.Tensor, ctx: TensorContext) -> Payload:
        del ctx
        return (flat,)

    def decompress(self, payload: Payload, ctx: TensorContext) -> tf.Tensor:
        del ctx
        return tf.cast(payload[0], tf.float32)

    def payload_spec(self, ctx: TensorContext) -> List[Tuple[tf.DType, List[int]]]:
        """(dtype, shape) of each payload tensor for the tensor `ctx` describes."""
        return [(tf.float32, [ctx.size])]


@COMPRESSORS.register("fp16")
class FP16Compressor(Compressor):
    """Half precision: half the bytes, relative error at most 2**-11 in fp16's normal range."""

    lossless = False

    def compress(self, flat, ctx):
        return (tf.cast(flat, tf.float16),)

    def payload_spec(self, ctx):
        return [(tf.float16, [ctx.size])]


@COMPRESSORS.register("topk")
class TopKCompressor(Compressor):
    """The k = ceil(ratio * size) entries of largest magnitude, as float32 values and int32
    indices (int32 halves the index bytes; updates beyond 2**31 entries are refused).
    ``--topk_ratio`` sets the ratio."""

    sparse = True
    lossless = False

    def __init__(self, config=None, ratio: float = None):
        self.ratio = ratio if ratio is not None else config.topk_ratio

    def k(self, size: int) -> int:
        return max(1, min(size, int(math.ceil(self.ratio * size - 1e-9))))

    def compress(self, flat, ctx):
        size = ctx.size
        if size >= 2 ** 31:
            raise ValueError(f"{size} entries do not fit int32 indices")
        indices = top_k_indices(flat, self.k(size))
        return tf.gather(flat, indices), indices

    def decompress(self, payload, ctx):
        # A segment sum: entries sharing an index add up (as with scatter_nd, but it measured
        # about 40 % faster on CPU for a 1M-entry update).
        values, indices = payload
        return tf.math.unsorted_segment_sum(tf.cast(values, tf.float32), indices, ctx.size)

    def payload_spec(self, ctx):
        k = self.k(ctx.size)
        return [(tf.float32, [k]), (tf.int32, [k])]


CANDIDATE_MARGIN = 1.3  # candidates kept above the sampled threshold, in units of k


def top_k_indices(flat: tf.Tensor, k: int, sample_size: int = 20000) -> tf.Tensor:
    """int32 indices of the k entries of largest magnitude of `flat` (1-D, static size).

    ``tf.math.top_k`` over millions of entries is slow on CPU. As in Deep Gradient Compression,
    a threshold is estimated from an evenly strided sample, set to keep about 1.3 k entries;
    the exact Top-K is then taken among the entries above it. If the estimate keeps fewer than
    k entries (with a 20,000-entry sample, about 4 standard deviations off for k = 1 % of the
    entries), the full ``top_k`` runs instead, so the result is always the exact Top-K.
    Magnitudes are taken of the sample and of the candidates only, besides the one comparison
    over every entry.
    """
    size = flat.shape[0]
    if size <= 4 * sample_size or 8 * k > size:
        return tf.math.top_k(tf.abs(flat), k, sorted=False).indices
    sample = tf.abs(flat[::size // sample_size])
    keep = max(1, int(math.ceil(CANDIDATE_MARGIN * k / size * int(sample.shape[0]))))
    threshold = tf.reduce_min(tf.math.top_k(sample, keep, sorted=False).values)
    candidates = tf.cast(tf.where(tf.abs(flat) >= threshold)[:, 0], tf.int32)

    def among_candidates():
        best = tf.math.top_k(tf.abs(tf.gather(flat, candidates)), k, sorted=False).indices
        return tf.gather(candidates, best)

    def full():
        return tf.math.top_k(tf.abs(flat), k, sorted=False).indices

    return tf.cond(tf.size(candidates) >= k, among_candidates, full)
