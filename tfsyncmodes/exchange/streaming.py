"""Streaming periodic averaging (``--sync_fragments``), after Streaming DiLoCo (Douillard et al.,
2025): the model averaged across groups in `fragments` pieces, each on its own staggered
schedule, so that an exchange carries about 1/fragments of the model.

The fragments are equal blocks of the flattened model (sequential: fragment p holds entries
[p * n // K, (p + 1) * n // K) of the n entries, in the variables' order; a block may cut a
variable). Fragment p is averaged after the updates s where ``(s - offset_p) % period == 0``,
``offset_p = p * period // K``: the K fragments spread evenly over the period, one exchange at a
time (so K <= period). Each fragment has its own slice of the anchor, of the error-feedback
residual and of the outer optimizer's state (per-fragment momentum), so a fragment's round is
periodic averaging of those entries alone. The warm-up's rounds (``warmup_steps``) average the
whole model at once. Rounds run inside the step: the paper's overlap (a fragment's exchange
carried while the next tau inner steps run) is not done here.
"""
from __future__ import annotations

import functools

import tensorflow as tf

from tfsyncmodes.exchange.flat import assign_flat, flatten_variables, window, with_window
from tfsyncmodes.exchange.link import CrossGroupLink
from tfsyncmodes.exchange.policies import PeriodicAverage


class StreamingAverage(PeriodicAverage):
    """:class:`~tfsyncmodes.exchange.policies.PeriodicAverage` in `fragments` staggered pieces
    (the module's docstring has the schedule). `fragments` 1 is periodic averaging."""

    def __init__(self, link: CrossGroupLink, period: int = 8, warmup_steps: int = 0, outer=None,
                 fragments: int = 2):
        super().__init__(link, period, warmup_steps, outer)
        if not 1 <= fragments <= period:
            raise ValueError(f"StreamingAverage(fragments={fragments}, period={period}): use 1 to period "
                             "fragments (one fragment's exchange per update)")
        self.fragments = fragments
        self.blocks = ()

    @property
    def offsets(self):
        """The update (mod period) after which each fragment is averaged."""
        return tuple(p * self.period // self.fragments for p in range(self.fragments))

    def build(self, variables, state):
        super().build(variables, state)
        size, count = self.ctx.size, self.fragments
        if count > size:
            raise ValueError(f"StreamingAverage(fragments={count}): the model has only {size} entries")
        self.blocks = tuple(self.ctx.part(p * size // count, (p + 1) * size // count, f"fragment{p}")
                           for p in range(count))

    def _due_each(self, step: tf.Tensor):
        return [tf.equal(tf.math.floormod(step - offset, self.period), 0) for offset in self.offsets]

    def due(self, step: tf.Tensor) -> tf.Tensor:
        """Whether some fragment is averaged after update `step` (at most one is)."""
        return tf.reduce_any(tf.stack(self._due_each(step)))

    def round(self, variables):
        """The due fragment's round (the whole model's during the warm-up)."""
        step = tf.convert_to_tensor(self.step)
        due = sum(tf.where(d, p, 0) for p, d in enumerate(self._due_each(step)))
        index = tf.where(step <= self.warmup_steps, self.fragments, due)
        branches = [functools.partial(self.fragment_round, variables, part) for part in self.blocks]
        tf.switch_case(index, branches + [functools.partial(self._whole_round, variables)])

    def _whole_round(self, variables):
        super().round(variables)
        return tf.constant(True)

    def fragment_round(self, variables, part):
        """Periodic averaging of the entries `part` covers: the groups' mean change of them since
        their last average, sent alone, through the outer optimizer with their own state."""
        flat = flatten_variables(variables)
        anchor = tf.convert_to_tensor(self.anchor)
        payload = self.link.send(window(flat, part) - window(anchor, part), part)
        mean_change = (self.link.sent(payload, part) + self.link.exchange(payload, part)) / float(self.num_groups)
        averaged = self.outer.step(window(anchor, part), mean_change, part)
        with tf.control_dependencies([assign_flat(variables, with_window(flat, part, averaged))]):
            self.anchor.assign(with_window(anchor, part, averaged))
        return tf.constant(True)
