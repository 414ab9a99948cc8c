"""The quantizing compressors: ``int8``, ``int4`` and ``int2`` send every entry as a packed
code with a float32 (lo, scale) per chunk; ``topk_int8``, ``topk_int4`` and ``topk_int2`` send
Top-K's indices packed with its values quantized so (SparseLoCo: 1-3 % Top-K, 2-bit values,
error feedback, indices packed). An index is its low 16 bits (uint16) and the count of indices in
each block of 65,536 entries (int32, one a block): 2 bytes an index instead of 4, exact at any
size (the indices are sorted, so the counts give each one's block back). The rule (μ ± kσ clipping, round half to even) is
:mod:`~tfsyncmodes.exchange.quantize`'s.

Payloads of different ranks have different scales, so they cannot be summed by an allreduce
in their own dtype: every quantizer is ``sparse`` (the communicator allgathers), and
``decompress`` of several ranks' concatenated payloads is the sum of each one's values, added
in the order of the payloads (so every rank gets the same bits). ``decompress`` of one payload
is exactly what was sent, so :class:`~tfsyncmodes.exchange.memory.ErrorFeedback` keeps
exactly what quantization (and Top-K) left out.

Settings: `clip_sigma` (k of μ ± kσ; ``--sync_quantize_sigma``, default 6), `chunk` (entries
per scale; 0: one scale for the whole tensor) and `implementation` (``auto``, ``native``: the
compiled kernels, ``ops``: TensorFlow ops; the same bits); the Top-K ones also Top-K's `ratio`
and `warmup` (`implementation` picks Top-K's kernels too).
"""
from __future__ import annotations

import tensorflow as tf

from tfsyncmodes.exchange import quantize
from tfsyncmodes.exchange.compressors import Compressor, TopK
from tfsyncmodes.registry import COMPRESSORS


class Quantized(Compressor):
    """Every entry as a `bits`-bit code: payload (uint8 codes, float32 [lo, scale] per chunk)."""

    sparse = True  # scales differ per rank: allgather, never an allreduce of the codes
    lossless = False
    bits = 8

    def __init__(self, clip_sigma: float = 6.0, chunk: int = 0, implementation: str = "auto"):
        quantize.check_bits(self.bits)
        if not clip_sigma > 0:
            raise ValueError(f"clip_sigma {clip_sigma}: use a positive number of standard deviations")
        if chunk < 0:
            raise ValueError(f"chunk {chunk}: use 0 (one scale per tensor) or a positive number of entries")
        self.clip_sigma = float(clip_sigma)
        self.chunk = int(chunk)
        self.quantizer = quantize.Quantizer(implementation)

    @property
    def implementation(self) -> str:
        """``native`` or ``ops``: the quantizer in use."""
        return self.quantizer.implementation

    def compress(self, flat, ctx):
        return self.quantizer.encode(flat, self.bits, self.clip_sigma, self.chunk)

    def decompress(self, payload, ctx):
        codes, lo_scale = payload
        return self.quantizer.decode(codes, lo_scale, self.bits, ctx.size, self.chunk, summed=True)

    def payload_spec(self, ctx):
        return [(tf.uint8, [quantize.packed_size(ctx.size, self.bits)]),
                (tf.float32, [2 * quantize.num_chunks(ctx.size, self.chunk)])]


@COMPRESSORS.register("int8")
class Int8(Quantized):
    """8-bit codes, one per byte: a quarter of float32's bytes."""

    bits = 8


@COMPRESSORS.register("int4")
class Int4(Quantized):
    """4-bit codes, two per byte: an eighth of float32's bytes."""

    bits = 4


@COMPRESSORS.register("int2")
class Int2(Quantized):
    """2-bit codes, four per byte: a sixteenth of float32's bytes."""

    bits = 2


_VALUES = {cls.bits: cls for cls in (Int8, Int4, Int2)}  # a Top-K form's values, by bits


INDEX_BLOCK = 2 ** 16  # entries per block of packed indices: a low part fits uint16


def index_blocks(size: int) -> int:
    """Blocks of INDEX_BLOCK entries in a tensor of `size` entries."""
    return max(1, -(-size // INDEX_BLOCK))


def pack_indices(indices: tf.Tensor, size: int, native=None):
    """Sorted int32 `indices` as (uint16 low parts, int32 count per block); with `native` (the
    compiled kernels' module) in one kernel."""
    if native is not None:
        return native.tfsync_pack_indices(indices, size=size)
    blocks = index_blocks(size)
    counts = tf.math.bincount(indices // INDEX_BLOCK, minlength=blocks, maxlength=blocks, dtype=tf.int32)
    return tf.cast(indices % INDEX_BLOCK, tf.uint16), counts


def unpack_indices(low: tf.Tensor, counts: tf.Tensor, size: int, native=None) -> tf.Tensor:
    """The int32 indices of one or several ranks' concatenated packed indices (with `native`,
    in one kernel)."""
    if native is not None:
        return native.tfsync_unpack_indices(low, counts, size=size)
    blocks = index_blocks(size)
    block_ids = tf.tile(tf.range(blocks), [tf.size(counts) // blocks])
    return tf.repeat(block_ids, counts) * INDEX_BLOCK + tf.cast(low, tf.int32)


class QuantizedTopK(TopK):
    """Top-K, its values quantized: payload (uint8 codes, float32 [lo, scale] per chunk, the
    indices in increasing order packed as uint16 low parts and int32 counts per block, the values
    in that order). The quantization error of the sent entries and the unsent entries stay in the
    error feedback's residual."""

    bits = 8

    def __init__(self, ratio: float = 0.01, implementation: str = "auto", clip_sigma: float = 6.0,
                 chunk: int = 0, warmup=None):
        super().__init__(ratio, implementation, warmup)
        self.values = _VALUES[self.bits](clip_sigma, chunk, implementation)

    def compress_k(self, flat, k):
        values, indices = self.selection.select(flat, k)
        if self.selection.native is None:  # the ops selection's order is arbitrary; chunks follow index order
            indices = tf.sort(indices)
            values = tf.gather(flat, indices)
        codes, lo_scale = self.values.compress(values, None)
        return (codes, lo_scale) + pack_indices(indices, int(flat.shape[0]), self.selection.native)

    def decompress(self, payload, ctx):
        codes, lo_scale = payload[:2]
        indices = self.sent_indices(payload, ctx)

        def with_k(k):
            values = self.values.quantizer.decode(codes, lo_scale, self.bits, k, self.values.chunk)
            return self.selection.scatter(values, indices, ctx.size)

        return self.staged(ctx.size, with_k)

    def sent_indices(self, payload, ctx):
        return unpack_indices(payload[2], payload[3], ctx.size, self.selection.native)

    def payload_spec(self, ctx):
        k = self.k(ctx.size)
        return [(tf.uint8, [quantize.packed_size(k, self.bits)]),
                (tf.float32, [2 * quantize.num_chunks(k, self.values.chunk)]), (tf.uint16, [k]),
                (tf.int32, [index_blocks(ctx.size)])]


@COMPRESSORS.register("topk_int8")
class TopKInt8(QuantizedTopK):
    """Top-K with 8-bit values."""

    bits = 8


@COMPRESSORS.register("topk_int4")
class TopKInt4(QuantizedTopK):
    """Top-K with 4-bit values."""

    bits = 4


@COMPRESSORS.register("topk_int2")
class TopKInt2(QuantizedTopK):
    """Top-K with 2-bit values (SparseLoCo's)."""

    bits = 2
