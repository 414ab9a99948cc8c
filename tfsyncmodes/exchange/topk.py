"""Exact Top-K by magnitude and its dense inverse, for the ``topk`` compressor.

Two implementations give the same set of entries (the k of largest magnitude, ties broken
towards the lower index, as a stable sort by decreasing magnitude and as ``tf.math.top_k``):

``native``
    Two small CPU kernels (``native/topk_ops.cc``) compiled against the installed TensorFlow
    by ``scripts/install.sh``, or on first use into a cache per TensorFlow version and sources
    (:mod:`~tfsyncmodes.exchange.kernels`): the selection in one pass
    over the update (SSE2 comparisons of 16 entries into a bit mask) that keeps the entries
    above a sampled threshold, ``nth_element`` among those ~1.3 k candidates for the exact k-th,
    and a decompression that writes zeros and adds the k entries. Indices come out in
    increasing order.
``ops``
    TensorFlow ops only, used when the kernels cannot be built (no C++ compiler): Deep
    Gradient Compression's sampled threshold (Lin et al., ICLR 2018, section 3: estimate the
    threshold from a sample of the gradient, then select exactly among the entries above it),
    ``tf.where`` for the candidates, ``tf.math.top_k`` among them, and
    ``unsorted_segment_sum`` to decompress.

Where the time goes (``python -m benchmarks.bench_hybrid --only_b``, 1M entries, k = 1 %, as fractions
of a dense training step of that model): in ``ops``, abs and comparison over every entry 0.07,
``tf.where`` over the mask 0.08, ``top_k`` among the candidates 0.08, the sample's ``top_k``
0.04, gathering the values 0.04, the segment sum 0.06 (each with a call's dispatch, 0.02):
about 0.37 in all. ``tf.math.top_k`` over all entries (the exact fallback when the sampled
threshold keeps fewer than k) costs several dense steps, so a four times wider threshold is
tried first. ``native`` reads the update once for the selection (0.09 with dispatch) and writes
the zeros once for the decompression (0.04): about 0.11 per call.

Both are exact, so error feedback needs nothing special: what was not sent (the entries not
selected) stays whole in the residual.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import tensorflow as tf
from absl import logging

from tfsyncmodes.exchange import kernels

IMPLEMENTATIONS = kernels.IMPLEMENTATIONS
CANDIDATE_MARGIN = 1.3  # candidates kept above the sampled threshold, in units of k
SAMPLE_SIZE = 20000     # entries the ``ops`` threshold is estimated from


def load_native():
    """The compiled kernels' module, or None when they are not built and cannot be (see
    :mod:`~tfsyncmodes.exchange.kernels`). Logs once which implementation Top-K runs, and why."""
    module, how = kernels.load()
    if module is not None:
        logging.log_first_n(logging.INFO, "tfsyncmodes: Top-K runs the compiled kernels (%s)", 1, how)
    else:
        logging.log_first_n(logging.WARNING, "tfsyncmodes: Top-K runs TensorFlow ops, slower than the compiled kernels "
                            "(%s)", 1, how)
    return module


class TopKSelection:
    """Selection and decompression with one implementation: ``auto`` takes ``native`` when it
    is built (or builds) and ``ops`` otherwise; ``native`` without the library is an error."""

    def __init__(self, implementation: str = "auto"):
        kernels.choose(implementation, "Top-K")  # checks the name, and that native is there
        self.native = None if implementation == "ops" else load_native()
        self.implementation = "native" if self.native is not None else "ops"

    def select(self, flat: tf.Tensor, k: int) -> Tuple[tf.Tensor, tf.Tensor]:
        """(float32 values, int32 indices) of the k entries of `flat` (1-D, static size) of
        largest magnitude."""
        if self.native is not None:
            return self.native.tfsync_top_k_magnitude(tf.cast(flat, tf.float32), k=k)
        indices = top_k_indices(flat, k)
        return tf.gather(flat, indices), indices

    def scatter(self, values: tf.Tensor, indices: tf.Tensor, size: int) -> tf.Tensor:
        """A dense float32 vector of `size` entries with `values` added at `indices` (entries
        sharing an index add up, so concatenated payloads decompress to their sum)."""
        values = tf.cast(values, tf.float32)
        if self.native is not None:
            return self.native.tfsync_scatter_dense(values, indices, size=size)
        # A segment sum: as scatter_nd, faster on CPU for a 1M-entry update.
        return tf.math.unsorted_segment_sum(values, indices, size)


def top_k_indices(flat: tf.Tensor, k: int, sample_size: int = SAMPLE_SIZE) -> tf.Tensor:
    """int32 indices of the k entries of largest magnitude of `flat` (1-D, static size), with
    TensorFlow ops.

    As in Deep Gradient Compression, a threshold is estimated from an evenly strided sample,
    set to keep about 1.3 k entries; the exact Top-K is then taken among the entries above it.
    If the estimate keeps fewer than k entries (with a 20,000-entry sample, about 4 standard
    deviations off for k = 1 % of the entries), a threshold that keeps four times as many
    sampled entries is tried, and only then the full ``top_k``, so the result is always the
    exact Top-K.
    """
    size = flat.shape[0]
    if size <= 4 * sample_size or 8 * k > size:
        return tf.math.top_k(tf.abs(flat), k, sorted=False).indices
    sample = tf.abs(flat[::size // sample_size])
    count = int(sample.shape[0])
    keep = max(1, int(math.ceil(CANDIDATE_MARGIN * k / size * count)))
    ranked = tf.math.top_k(sample, min(count, 4 * keep), sorted=True).values

    def among_candidates(threshold, otherwise):
        candidates = tf.cast(tf.where(tf.abs(flat) >= threshold)[:, 0], tf.int32)

        def best():
            chosen = tf.math.top_k(tf.abs(tf.gather(flat, candidates)), k, sorted=False).indices
            return tf.gather(candidates, chosen)

        return tf.cond(tf.size(candidates) >= k, best, otherwise)

    def full():
        return tf.math.top_k(tf.abs(flat), k, sorted=False).indices

    return among_candidates(ranked[keep - 1], lambda: among_candidates(ranked[-1], full))


def implementation_of(compressor) -> Optional[str]:
    """``native`` or ``ops`` for a Top-K compressor, None for another one."""
    selection = getattr(compressor, "selection", None)
    return selection.implementation if isinstance(selection, TopKSelection) else None
