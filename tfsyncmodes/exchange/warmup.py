"""Deep Gradient Compression's sparsity warm-up: Top-K starts dense and tightens
exponentially to its ratio (Lin et al., ICLR 2018, section 3.3).

The warm-up's densities are ``factor``, ``factor**2``, ... while above the final ratio, then
the ratio itself (``factor`` 0.25: 25 %, 6.25 %, 1.5625 %, 0.39 %, ...). The first `steps`
steps are split evenly among the warm-up densities, in order: step t (counted from 0, by this
part's own counter, so a resumed run does not warm up again) uses density
``min(t * S // steps, S)``-th of the list, S the number of warm-up densities. The warm-up is
counted in steps, not epochs: ``--sync_dgc_warmup_steps``; DGC's four epochs are four times the
steps of an epoch.

It is a part of the chain (it counts the steps, after each update) and a setting of the Top-K
compressor (``TopK(ratio=0.01, warmup=SparsityWarmup(steps=400))``), which reads
:meth:`SparsityWarmup.stage`.
"""
from __future__ import annotations

from typing import List

import tensorflow as tf

from tfsyncmodes.exchange.base import Part


def warmup_densities(ratio: float, factor: float = 0.25) -> List[float]:
    """The densities of the warm-up before `ratio`: factor, factor**2, ... while above it."""
    out, density = [], factor
    while density > ratio and len(out) < 64:
        out.append(density)
        density *= factor
    return out


class SparsityWarmup(Part):
    """`steps`: steps of warm-up (0: none); `factor`: each warm-up density is this times the
    one before, starting from `factor`."""

    def __init__(self, steps: int, factor: float = 0.25):
        if steps < 0 or not 0.0 < factor < 1.0:
            raise ValueError(f"sparsity warm-up of {steps} steps with factor {factor}: use steps >= 0 "
                             "and a factor in (0, 1)")
        self.steps = int(steps)
        self.factor = float(factor)
        self.counter = None
        self._stages = 0

    def ratios(self, ratio: float) -> List[float]:
        """The ratio of each stage, the final `ratio` last."""
        warm = warmup_densities(ratio, self.factor) if self.steps else []
        self._stages = len(warm)
        return warm + [ratio]

    def build(self, variables, state):
        del variables
        self.counter = state("sparsity_warmup_step", [], tf.int64)

    def stage(self) -> tf.Tensor:
        """int32: this step's stage, an index into :meth:`ratios`."""
        if not self._stages:
            return tf.constant(0, tf.int32)
        step = tf.convert_to_tensor(self.counter)
        index = tf.minimum(step * self._stages // self.steps, self._stages)
        return tf.cast(index, tf.int32)

    def after_update(self, variables):
        del variables
        self.counter.assign_add(1)
