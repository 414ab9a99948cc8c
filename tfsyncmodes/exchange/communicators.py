"""Communicators: how gradients cross processes."""
from __future__ import annotations

from tfsyncmodes.exchange.base import GradientTransform, densify


class HorovodAllreduce(GradientTransform):
    """Averages every gradient across the ranks of a Horovod process set in one grouped call.

    Horovod's fusion buffer packs the group into few messages, as its own
    DistributedOptimizer does. ``None`` gradients (variables the loss does not reach) are left
    out of the exchange and stay ``None`` on every rank.
    """

    def __init__(self, process_set=None):
        self.process_set = process_set

    def __call__(self, grads, variables):
        import horovod.tensorflow as hvd

        present = [i for i, g in enumerate(grads) if g is not None]
        if not present:
            return grads
        kwargs = {} if self.process_set is None else {"process_set": self.process_set}
        reduced = hvd.grouped_allreduce([densify(grads[i]) for i in present], op=hvd.Average, **kwargs)
        out = list(grads)
        for i, value in zip(present, reduced):
            out[i] = value
        return out
