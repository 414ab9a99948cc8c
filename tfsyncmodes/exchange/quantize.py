"""Uniform quantization to 8, 4 or 2 bits with μ ± kσ clipping, and the packing of codes into
bytes: the arithmetic of the quantizing compressors (:mod:`~tfsyncmodes.exchange.quantized`).

The rule, per chunk of `chunk` entries (0: the whole vector is one chunk; the last chunk may
be shorter), for ``bits`` b and ``levels = 2**b - 1``:

- μ and σ (population standard deviation) of the chunk, computed in float64;
- ``lo = max(float32(μ - kσ), min)`` and ``hi = min(float32(μ + kσ), max)``: the range is the
  chunk's own, clipped to μ ± kσ (INTELLECT-1 clips at k = 6);
- ``scale = float32(hi - lo) / levels`` (float32 arithmetic);
- ``code = round_half_to_even((clip(x, lo, hi) - lo) / scale)``, in [0, levels]; a chunk with
  ``scale == 0`` (constant, or clipped to one value) gets code 0 everywhere;
- ``value = lo + code * scale`` (float32: one product, one sum, each rounded).

An entry inside [lo, hi] comes back within scale / 2 (plus float32 rounding); one clipped away
comes back as lo or hi, and error feedback keeps the difference. ``decode`` is exactly what
was sent, so the residual ``compensated - decode(payload)`` is exact.

Codes are packed little end first: ``8 / b`` codes per uint8, code j of a byte in bits
``[b * j, b * (j + 1))``; the last byte is padded with zero codes.

Two implementations give the same bits (:class:`Quantizer`): ``native``, two CPU kernels
(``native/quantize_ops.cc``, built with the Top-K ones: :mod:`~tfsyncmodes.exchange.kernels`)
that make the moments' two passes block by block in cache and split the blocks over
TensorFlow's CPU threads; and ``ops``, the TensorFlow ops below, used when the kernels cannot
be built.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import tensorflow as tf
from absl import logging

from tfsyncmodes.exchange import kernels

BITS = (8, 4, 2)


def check_bits(bits: int) -> int:
    if bits not in BITS:
        raise ValueError(f"{bits}-bit quantization: use one of {', '.join(map(str, BITS))}")
    return bits


def packed_size(count: int, bits: int) -> int:
    """Bytes that `count` codes of `bits` bits occupy."""
    per_byte = 8 // bits
    return -(-count // per_byte)


def num_chunks(count: int, chunk: int) -> int:
    return 1 if chunk <= 0 or chunk >= count else int(math.ceil(count / chunk))


def pack(codes: tf.Tensor, bits: int) -> tf.Tensor:
    """uint8 bytes of 1-D `codes` (integers in [0, 2**bits)), ``8 / bits`` per byte. All in
    uint8: the shifted codes of a byte have no bit in common, so their sum is exact."""
    small = tf.cast(codes, tf.uint8)
    if bits == 8:
        return small
    per_byte = 8 // bits
    count = int(codes.shape[0])
    padded = tf.pad(small, [[0, packed_size(count, bits) * per_byte - count]])
    shifts = tf.constant([bits * j for j in range(per_byte)], tf.uint8)
    return tf.reduce_sum(tf.bitwise.left_shift(tf.reshape(padded, [-1, per_byte]), shifts), axis=1)


def unpack(packed: tf.Tensor, bits: int, count: int) -> tf.Tensor:
    """uint8 codes [rows, count] of `packed` bytes [rows, packed_size(count, bits)]."""
    if bits == 8:
        return packed[:, :count]
    per_byte = 8 // bits
    shifts = tf.constant([bits * j for j in range(per_byte)], tf.uint8)
    codes = tf.bitwise.bitwise_and(tf.bitwise.right_shift(packed[:, :, None], shifts),
                                   tf.constant((1 << bits) - 1, tf.uint8))
    return tf.reshape(codes, [tf.shape(packed)[0], -1])[:, :count]


def _chunked(flat: tf.Tensor, chunk: int) -> Tuple[tf.Tensor, Optional[tf.Tensor]]:
    """(flat padded to whole chunks as [chunks, width], mask of the real entries or None when
    there is no padding)."""
    count = int(flat.shape[0])
    chunks = num_chunks(count, chunk)
    width = chunk if chunks > 1 else count
    pad = chunks * width - count
    if pad == 0:
        return tf.reshape(flat, [chunks, width]), None
    mask = tf.reshape(tf.concat([tf.ones([count], tf.bool), tf.zeros([pad], tf.bool)], 0), [chunks, width])
    return tf.reshape(tf.pad(flat, [[0, pad]]), [chunks, width]), mask


def ranges(flat: tf.Tensor, bits: int, clip_sigma: float, chunk: int) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(lo, hi, scale) per chunk, float32 [chunks], of the rule above."""
    x, mask = _chunked(tf.cast(flat, tf.float32), chunk)
    # Whole chunks have no padding to leave out: no mask, one pass fewer for each moment.
    real = None if mask is None else tf.cast(mask, tf.float64)

    def real_only(values):
        return values if real is None else values * real

    wide = real_only(tf.cast(x, tf.float64))
    n = tf.cast(tf.shape(x)[1], tf.float64) if real is None else tf.reduce_sum(real, axis=1)
    mean = tf.reduce_sum(wide, axis=1) / n
    std = tf.sqrt(tf.reduce_sum(tf.square(real_only(wide - mean[:, None])), axis=1) / n)
    big = tf.constant(float("inf"), tf.float32)
    low = tf.reduce_min(x if mask is None else tf.where(mask, x, big), axis=1)
    high = tf.reduce_max(x if mask is None else tf.where(mask, x, -big), axis=1)
    lo = tf.maximum(tf.cast(mean - clip_sigma * std, tf.float32), low)
    hi = tf.minimum(tf.cast(mean + clip_sigma * std, tf.float32), high)
    hi = tf.maximum(hi, lo)
    return lo, hi, (hi - lo) / float(2 ** bits - 1)


def encode(flat: tf.Tensor, bits: int, clip_sigma: float, chunk: int) -> Tuple[tf.Tensor, tf.Tensor]:
    """(packed uint8 codes, float32 [lo, scale] per chunk, interleaved) of 1-D `flat`."""
    count = int(flat.shape[0])
    lo, hi, scale = ranges(flat, bits, clip_sigma, chunk)
    x, _ = _chunked(tf.cast(flat, tf.float32), chunk)
    safe = tf.where(scale > 0, scale, tf.ones_like(scale))
    ratio = (tf.minimum(tf.maximum(x, lo[:, None]), hi[:, None]) - lo[:, None]) / safe[:, None]
    codes = tf.where((scale > 0)[:, None], tf.clip_by_value(tf.round(ratio), 0.0, float(2 ** bits - 1)), 0.0)
    codes = tf.reshape(codes, [-1])[:count]
    return pack(codes, bits), tf.reshape(tf.stack([lo, scale], axis=1), [-1])


def decode(packed: tf.Tensor, lo_scale: tf.Tensor, bits: int, count: int, chunk: int) -> tf.Tensor:
    """float32 values [rows * count] of `rows` concatenated payloads (each `count` codes), row
    after row. Each chunk's lo and scale broadcast over its codes (no copy of them per entry)."""
    chunks = num_chunks(count, chunk)
    width = chunk if chunks > 1 else count
    rows_codes = unpack(tf.reshape(packed, [-1, packed_size(count, bits)]), bits, count)
    pad = chunks * width - count
    if pad:
        rows_codes = tf.pad(rows_codes, [[0, 0], [0, pad]])
    codes = tf.cast(tf.reshape(rows_codes, [-1, chunks, width]), tf.float32)
    pairs = tf.reshape(lo_scale, [-1, chunks, 2])
    values = pairs[:, :, 0:1] + codes * pairs[:, :, 1:2]
    return tf.reshape(tf.reshape(values, [-1, chunks * width])[:, :count], [-1])


def sum_rows(values: tf.Tensor, size: int) -> tf.Tensor:
    """The sum of the [rows * size] `values`, row after row: ((row 0 + row 1) + row 2) + ...
    on every rank alike, one add of `size` entries a row (a loop: the row count is known only
    when the graph runs, after an allgather; a segment sum in order cost 7x as much)."""
    rows = tf.reshape(values, [-1, size])
    _, total = tf.while_loop(lambda i, total: i < tf.shape(rows)[0], lambda i, total: (i + 1, total + rows[i]),
                             (tf.constant(1), rows[0]))
    return total


class Quantizer:
    """:func:`encode` and :func:`decode` with one implementation: ``auto`` takes ``native`` (the
    compiled kernels) when they are built (or build) and ``ops`` otherwise; ``native`` without
    them is an error. Logs once which one runs."""

    def __init__(self, implementation: str = "auto"):
        self.native = kernels.choose(implementation, "quantization")
        self.implementation = "native" if self.native is not None else "ops"
        if self.native is not None:
            logging.log_first_n(logging.INFO, "tfsyncmodes: quantization runs the compiled kernels (%s)", 1,
                                kernels.load()[1])
        elif implementation == "auto":
            logging.log_first_n(logging.WARNING, "tfsyncmodes: quantization runs TensorFlow ops, slower than the "
                                "compiled kernels (%s)", 1, kernels.load()[1])

    def encode(self, flat: tf.Tensor, bits: int, clip_sigma: float, chunk: int) -> Tuple[tf.Tensor, tf.Tensor]:
        """As :func:`encode`."""
        if self.native is None:
            return encode(flat, bits, clip_sigma, chunk)
        codes, lo_scale = self.native.tfsync_quantize(tf.cast(flat, tf.float32), tf.constant(clip_sigma, tf.float64),
                                                      bits=bits, chunk=chunk)
        return codes, lo_scale

    def decode(self, packed: tf.Tensor, lo_scale: tf.Tensor, bits: int, count: int, chunk: int,
               summed: bool = False) -> tf.Tensor:
        """As :func:`decode`; with `summed`, the rows' sum [count] as :func:`sum_rows` adds them."""
        if self.native is None:
            values = decode(packed, lo_scale, bits, count, chunk)
            return sum_rows(values, count) if summed else values
        return self.native.tfsync_dequantize(packed, lo_scale, bits=bits, count=count, chunk=chunk, sum=summed)
