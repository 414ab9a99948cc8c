"""Communicators: how gradients and payloads cross processes.

:class:`HorovodAllreduce` is a part (dense mean over a process set, every step).
A cross-group communicator's contract is ``send_receive(payload, compressor, ctx, name,
everyone=False) -> the sum of the other groups' updates`` (with `everyone`, of every group's,
this one's included, summed in the same order on every rank); decompressed, dense float32. It
may run as many collective rounds as it needs.
"""
from __future__ import annotations

from typing import Sequence, Tuple

from tfsyncmodes.exchange.base import Part, densify


def horovod_world() -> Tuple[int, int]:
    """(rank, size) of the initialised Horovod world; (0, 0) when Horovod is absent or not
    initialised."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return 0, 0
    return (hvd.rank(), hvd.size()) if hvd.is_initialized() else (0, 0)


def under_tf_distribute() -> bool:
    """Whether a tf.distribute strategy's scope or replica context is active (it reduces
    gradients itself)."""
    import tensorflow as tf

    return tf.distribute.has_strategy()


def world_mean(tensors: Sequence, name: str) -> list:
    """The mean of every tensor over all Horovod ranks, in one grouped allreduce."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    return hvd.grouped_allreduce([tf.convert_to_tensor(t) for t in tensors], op=hvd.Average,
                                 process_set=hvd.global_process_set, name=name)


def assign_world_mean(variables: Sequence, name: str) -> None:
    """Every variable set to its mean over all Horovod ranks."""
    for variable, mean in zip(variables, world_mean(variables, name)):
        variable.assign(mean)


def world_allgather(tensor, name: str):
    """`tensor` of every Horovod rank, concatenated along the first axis in rank order."""
    import horovod.tensorflow as hvd

    return hvd.allgather(tensor, name=name, process_set=hvd.global_process_set)


class HorovodAllreduce(Part):
    """Averages every gradient across the ranks of a Horovod process set in one grouped call.

    Horovod's fusion buffer packs the group into few messages, as its own
    DistributedOptimizer does. ``None`` gradients (variables the loss does not reach) are left
    out of the exchange and stay ``None`` on every rank.
    """

    def __init__(self, process_set=None):
        self.process_set = process_set

    def transform(self, grads, variables):
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


class CrossGroupCommunicator:
    """Carries one payload per group across groups and returns the sum of the *other*
    groups' updates (a group's own update it already has, dense and fresh).

    `process_set` holds one rank of every group (a column, see
    :mod:`tfsyncmodes.exchange.groups`); `group_order[i]` is the position, in the process
    set's rank order, of group i's rank, and `own` this rank's group, so that every column
    sums in group order. ``None`` as process set: a single group, nothing to exchange.
    """

    def __init__(self, process_set, group_order, own: int):
        self.process_set = process_set
        self.group_order = list(group_order)
        self.own = own

    @property
    def num_groups(self) -> int:
        return len(self.group_order)

    def send_receive(self, payload, compressor, ctx, name: str, everyone: bool = False):
        raise NotImplementedError


class CrossGroupAllgather(CrossGroupCommunicator):
    """For sparse payloads (Top-K): each rank's indices differ, so values and int32 indices
    are allgathered and the other groups' rows decompressed (entries sharing an index add)."""

    def send_receive(self, payload, compressor, ctx, name, everyone=False):
        import tensorflow as tf

        if self.process_set is None:
            return compressor.decompress(tuple(payload), ctx) if everyone else tf.zeros([ctx.size], tf.float32)
        import horovod.tensorflow as hvd

        others = [p for g, p in enumerate(self.group_order) if everyone or g != self.own]
        gathered = []
        for i, tensor in enumerate(payload):
            everyone = hvd.allgather(tensor, name=f"{name}.{i}", process_set=self.process_set)
            rows = tf.reshape(everyone, [self.num_groups, -1])
            gathered.append(tf.reshape(tf.gather(rows, others), [-1]))
        return compressor.decompress(tuple(gathered), ctx)


class CrossGroupAllreduce(CrossGroupCommunicator):
    """For dense payloads (float32, fp16): one allreduce in the payload's own dtype, so fp16
    puts half the bytes on the wire; the other groups' part is the sum minus this one's."""

    def send_receive(self, payload, compressor, ctx, name, everyone=False):
        import tensorflow as tf

        if self.process_set is None:
            return compressor.decompress(tuple(payload), ctx) if everyone else tf.zeros([ctx.size], tf.float32)
        import horovod.tensorflow as hvd

        summed = compressor.decompress(tuple(
            hvd.allreduce(t, op=hvd.Sum, name=f"{name}.{i}", process_set=self.process_set)
            for i, t in enumerate(payload)), ctx)
        return summed if everyone else summed - compressor.decompress(tuple(payload), ctx)


def cross_group(compressor, process_set, group_order, own: int) -> CrossGroupCommunicator:
    """Allgather for sparse payloads (indices differ per group), allreduce for dense ones."""
    cls = CrossGroupAllgather if compressor.sparse else CrossGroupAllreduce
    return cls(process_set, group_order, own)
