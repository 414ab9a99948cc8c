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
``@COMPRESSORS.register("name")``; ``--sync_compression=name`` then selects it. Its settings are its
constructor's keyword arguments (as ``TopK(ratio=0.01)``), each with a default;
:mod:`~tfsyncmodes.exchange.recipes` maps the knobs to them.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from tfsyncmodes.exchange.flat import TensorContext
from tfsyncmodes.exchange.topk import TopKSelection
from tfsyncmodes.registry import COMPRESSORS

Payload = Tuple[tf.Tensor, ...]


def payload_bytes(payload: Sequence[tf.Tensor]) -> tf.Tensor:
    """Bytes the payload's tensors occupy on the wire, from their real sizes and dtypes."""
    return tf.add_n([tf.size(t, out_type=tf.int64) * t.dtype.size for t in payload])


class Compressor:
    """Base: the contract, with the identity's behaviour (the update travels as float32)."""

    sparse = False
    lossless = True

    def compress(self, flat: tf.Tensor, ctx: TensorContext) -> Payload:
        del ctx
        return (flat,)

    def decompress(self, payload: Payload, ctx: TensorContext) -> tf.Tensor:
        del ctx
        return tf.cast(payload[0], tf.float32)

    def payload_spec(self, ctx: TensorContext) -> List[Tuple[tf.DType, List[int]]]:
        """(dtype, shape) of each payload tensor for the tensor `ctx` describes."""
        return [(tf.float32, [ctx.size])]

    def sent_mask(self, payload: Payload, ctx: TensorContext) -> tf.Tensor:
        """float32 [size]: 1 at the entries one payload carries, 0 elsewhere (every entry for a
        dense compressor)."""
        del payload
        return tf.ones([ctx.size], tf.float32)


@COMPRESSORS.register("none")
class NoCompression(Compressor):
    """Identity: the update travels as float32."""


@COMPRESSORS.register("fp16")
class FP16(Compressor):
    """Half precision: half the bytes, relative error at most 2**-11 in fp16's normal range."""

    lossless = False

    def compress(self, flat, ctx):
        return (tf.cast(flat, tf.float16),)

    def payload_spec(self, ctx):
        return [(tf.float16, [ctx.size])]


@COMPRESSORS.register("topk")
class TopK(Compressor):
    """The k = ceil(ratio * size) entries of largest magnitude, as float32 values and int32
    indices (int32 halves the index bytes; updates beyond 2**31 entries are refused).

    `ratio`: the fraction of entries sent, in (0, 1]. `implementation`: ``auto`` (the
    compiled kernels when ``scripts/install.sh`` built them, TensorFlow ops otherwise),
    ``native`` or ``ops``; both are exact (see :mod:`~tfsyncmodes.exchange.topk`). `warmup`: a
    :class:`~tfsyncmodes.exchange.warmup.SparsityWarmup` whose stage picks the ratio of each
    step (None: `ratio` from the first step); under it the payload's length changes with the
    stage, so it is for in-step exchanges (sync mode), not for a background queue.
    `agree`: ``agree(indices, name) -> indices`` every rank shares, a collective (e.g.
    :func:`~tfsyncmodes.exchange.communicators.world_union`, the union of the ranks' own
    selections); with it each rank sends its values at the shared indices, so the payloads
    add in one allreduce of values (:attr:`shared_indices`; in-step exchanges only). None:
    each rank's own indices.
    """

    sparse = True
    lossless = False

    def __init__(self, ratio: float = 0.01, implementation: str = "auto", warmup=None,
                 agree: Optional[Callable] = None):
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"Top-K ratio {ratio}: use a fraction in (0, 1]")
        self.ratio = ratio
        self.selection = TopKSelection(implementation)
        self.warmup = warmup
        self.agree = agree

    @property
    def shared_indices(self) -> bool:
        """Whether every rank's payload has the same indices (the values then add by allreduce)."""
        return self.agree is not None

    @property
    def implementation(self) -> str:
        """``native`` or ``ops``: the selection in use."""
        return self.selection.implementation

    def k(self, size: int, ratio: Optional[float] = None) -> int:
        ratio = self.ratio if ratio is None else ratio
        return max(1, min(size, int(math.ceil(ratio * size - 1e-9))))

    def staged(self, size: int, fn: Callable[[int], object]):
        """`fn(k)` with the k of this step: the warm-up's stage picks among its ratios' k."""
        if self.warmup is None:
            return fn(self.k(size))
        ks = [self.k(size, r) for r in self.warmup.ratios(self.ratio)]
        if len(ks) == 1:
            return fn(ks[0])
        return tf.switch_case(self.warmup.stage(), [functools.partial(fn, k) for k in ks])

    def compress(self, flat, ctx):
        size = ctx.size
        if size >= 2 ** 31:
            raise ValueError(f"{size} entries do not fit int32 indices")
        payload = self.staged(size, lambda k: self.compress_k(flat, k))
        if self.agree is None:
            return payload
        shared = self.agree(self.sent_indices(payload, ctx), f"tfsync.topk.indices.{ctx.name}")
        return tf.gather(flat, shared), shared

    def compress_k(self, flat, k: int) -> Payload:
        """The payload of the k entries of largest magnitude."""
        return self.selection.select(flat, k)

    def decompress(self, payload, ctx):
        values, indices = payload
        return self.selection.scatter(values, indices, ctx.size)

    def sent_indices(self, payload, ctx) -> tf.Tensor:
        """The int32 indices `payload` sent."""
        return payload[-1]

    def sent_mask(self, payload, ctx):
        indices = self.sent_indices(payload, ctx)
        return self.selection.scatter(tf.ones(tf.shape(indices), tf.float32), indices, ctx.size)

    def payload_spec(self, ctx):
        k = self.k(ctx.size)
        return [(tf.float32, [k]), (tf.int32, [k])]
