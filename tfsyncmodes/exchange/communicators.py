"""Communicators: how gradients, payloads and values cross processes. This is the one module of
the exchange and the Keras glue that calls Horovod's collectives; every other part asks here.

- world-wide helpers over all Horovod ranks (:func:`world_mean`, :func:`world_average`,
  :func:`world_allgather`, :func:`broadcast_variables`), and :func:`group_min` over a process set;
- :class:`HorovodAllreduce`, a part: the dense mean over a process set, every step;
- cross-group communicators, whose contract is ``send_receive(payload, compressor, ctx, name,
  everyone=False) -> the sum of the other groups' updates`` (with `everyone`, of every group's,
  this one's included, summed in the same order on every rank), decompressed, dense float32,
  and ``wire_bytes(payload)``, what this rank puts on the cross-group wire for it. One may run
  as many collective rounds as it needs; between groups of several ranks a dense payload goes
  in slices (:class:`ShardedCrossGroupAllreduce`).

Horovod is imported in the functions that call it, so that importing the exchange does not
need it.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import tensorflow as tf

from tfsyncmodes.exchange.base import Part, densify
from tfsyncmodes.exchange.compressors import payload_bytes


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
    return tf.distribute.has_strategy()


def world_mean(tensors: Sequence, name: str) -> list:
    """The mean of every tensor over all Horovod ranks, in one grouped allreduce."""
    import horovod.tensorflow as hvd

    return hvd.grouped_allreduce([tf.convert_to_tensor(t) for t in tensors], op=hvd.Average,
                                 process_set=hvd.global_process_set, name=name)


def assign_world_mean(variables: Sequence, name: str) -> None:
    """Every variable set to its mean over all Horovod ranks."""
    for variable, mean in zip(variables, world_mean(variables, name)):
        variable.assign(mean)


def world_average(tensor, name: str) -> tf.Tensor:
    """The mean of one tensor over all Horovod ranks (one allreduce of its own)."""
    return world_reduce(tensor, True, name)


def world_sum(tensor, name: str):
    """`tensor` summed over all Horovod ranks."""
    return world_reduce(tensor, False, name)


def world_reduce(tensor, average: bool, name: Optional[str] = None):
    """`tensor` averaged (or summed) over all Horovod ranks, as ``strategy.reduce`` asks."""
    import horovod.tensorflow as hvd

    return hvd.allreduce(tf.convert_to_tensor(tensor), op=hvd.Average if average else hvd.Sum, name=name,
                         process_set=hvd.global_process_set)


def world_allgather(tensor, name: str):
    """`tensor` of every Horovod rank, concatenated along the first axis in rank order."""
    import horovod.tensorflow as hvd

    return hvd.allgather(tensor, name=name, process_set=hvd.global_process_set)


def world_union(indices, name: str) -> tf.Tensor:
    """The sorted union of every Horovod rank's int32 `indices` (one allgather): the same on
    every rank."""
    return tf.sort(tf.unique(world_allgather(indices, name)).y)


def broadcast_variables(variables: Sequence, root_rank: int, name: str, process_set=None) -> None:
    """Every variable set to rank `root_rank`'s value, one broadcast each (over `process_set`;
    None: all ranks)."""
    import horovod.tensorflow as hvd

    kwargs = {} if process_set is None else {"process_set": process_set}
    for index, variable in enumerate(variables):
        variable.assign(hvd.broadcast(tf.convert_to_tensor(variable), root_rank,
                                      name=f"{name}.{index}", **kwargs))


def group_min(value, process_set, name: str) -> tf.Tensor:
    """The minimum of `value` over the ranks of `process_set` (None: this rank's alone)."""
    if process_set is None:
        return value
    import horovod.tensorflow as hvd

    return hvd.allreduce(value, op=hvd.Min, process_set=process_set, name=name)


class HorovodAllreduce(Part):
    """Averages every gradient across the ranks of a Horovod process set in one grouped call.

    `process_set`: the ranks that average (None: all of them). Horovod's fusion buffer packs
    the group into few messages, as its own DistributedOptimizer does. ``None`` gradients
    (variables the loss does not reach) are left out of the exchange and stay ``None`` on
    every rank.
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

    def __init__(self, process_set, group_order: Sequence[int], own: int):
        self.process_set = process_set
        self.group_order = list(group_order)
        self.own = own

    @property
    def num_groups(self) -> int:
        return len(self.group_order)

    def send_receive(self, payload, compressor, ctx, name: str, everyone: bool = False):
        raise NotImplementedError

    def wire_bytes(self, payload) -> tf.Tensor:
        """Bytes this rank puts on the cross-group wire for `payload`: all of it."""
        return payload_bytes(payload)

    def _alone(self, payload, compressor, ctx, everyone: bool):
        return compressor.decompress(tuple(payload), ctx) if everyone else tf.zeros([ctx.size], tf.float32)


class CrossGroupAllgather(CrossGroupCommunicator):
    """For sparse payloads (Top-K): each rank's indices differ, so values and int32 indices
    are allgathered and the other groups' rows decompressed (entries sharing an index add)."""

    def send_receive(self, payload, compressor, ctx, name, everyone=False):
        if self.process_set is None:
            return self._alone(payload, compressor, ctx, everyone)
        import horovod.tensorflow as hvd

        others = [p for g, p in enumerate(self.group_order) if everyone or g != self.own]
        gathered = []
        for i, tensor in enumerate(payload):
            every = hvd.allgather(tensor, name=f"{name}.{i}", process_set=self.process_set)
            rows = tf.reshape(every, [self.num_groups, -1])
            gathered.append(tf.reshape(tf.gather(rows, others), [-1]))
        return compressor.decompress(tuple(gathered), ctx)


class CrossGroupSharedIndices(CrossGroupCommunicator):
    """For sparse payloads whose indices every group shares (Top-K with ``agree``): the values
    add in one allreduce, in their dtype; the indices stay where they are."""

    def send_receive(self, payload, compressor, ctx, name, everyone=False):
        if self.process_set is None:
            return self._alone(payload, compressor, ctx, everyone)
        import horovod.tensorflow as hvd

        values, indices = payload
        summed = hvd.allreduce(values, op=hvd.Sum, name=f"{name}.values", process_set=self.process_set)
        total = compressor.decompress((summed, indices), ctx)
        return total if everyone else total - compressor.decompress(tuple(payload), ctx)


class CrossGroupAllreduce(CrossGroupCommunicator):
    """For dense payloads (float32, fp16): one allreduce in the payload's own dtype, so fp16
    puts half the bytes on the wire; the other groups' part is the sum minus this one's."""

    def send_receive(self, payload, compressor, ctx, name, everyone=False):
        if self.process_set is None:
            return self._alone(payload, compressor, ctx, everyone)
        summed = compressor.decompress(tuple(self._sum(t, f"{name}.{i}") for i, t in enumerate(payload)), ctx)
        return summed if everyone else summed - compressor.decompress(tuple(payload), ctx)

    def _sum(self, tensor, name: str):
        """Every group's `tensor`, summed over the column."""
        import horovod.tensorflow as hvd

        return hvd.allreduce(tensor, op=hvd.Sum, name=name, process_set=self.process_set)


class ShardedCrossGroupAllreduce(CrossGroupAllreduce):
    """Dense payloads between groups of k > 1 ranks: the ranks of a group hold the same payload
    (their group's), so rank j of the group allreduces only the j-th of k near-equal slices of
    each payload tensor across its column, and the group then allgathers the k summed slices
    inside itself. A host's link carries one payload a round instead of k (one per column),
    and every rank ends with the same sum, each element summed over the same column in group
    order as before. Tensors of fewer than k elements, or not flat, go whole through the column.

    `group_set`: this rank's group's process set; `position`: this rank's place in its group
    (its column, in the group's rank order, which is Horovod's allgather order); `group_size`: k.
    """

    def __init__(self, process_set, group_order: Sequence[int], own: int, group_set, position: int,
                 group_size: int):
        super().__init__(process_set, group_order, own)
        self.group_set, self.position, self.group_size = group_set, position, group_size

    def _slice(self, tensor) -> Optional[Tuple[int, int]]:
        """[low, high) of this rank's slice of `tensor`, None if it travels whole."""
        n, k = (tensor.shape[0] if tensor.shape.rank == 1 else None), self.group_size
        if n is None or n < k:
            return None
        return n * self.position // k, n * (self.position + 1) // k

    def _sum(self, tensor, name: str):
        """This rank's slice summed over the column, then the group's slices gathered."""
        part = self._slice(tensor)
        if part is None:
            return super()._sum(tensor, name)
        import horovod.tensorflow as hvd

        mine = super()._sum(tensor[part[0]:part[1]], name)
        return tf.ensure_shape(hvd.allgather(mine, name=f"{name}.slices", process_set=self.group_set), tensor.shape)

    def wire_bytes(self, payload) -> tf.Tensor:
        """Bytes of this rank's slices (and of the tensors that travel whole)."""
        if any(t.shape.num_elements() is None for t in payload):
            return payload_bytes(payload)  # shapes known only when it runs: no slices either
        total = 0
        for tensor in payload:
            part = self._slice(tensor)
            total += (tensor.shape.num_elements() if part is None else part[1] - part[0]) * tensor.dtype.size
        return tf.constant(total, tf.int64)


def cross_group(compressor, process_set, group_order: Sequence[int], own: int) -> CrossGroupCommunicator:
    """Allgather for sparse payloads (indices differ per group), allreduce for dense ones."""
    if getattr(compressor, "shared_indices", False):
        cls = CrossGroupSharedIndices
    else:
        cls = CrossGroupAllgather if compressor.sparse else CrossGroupAllreduce
    return cls(process_set, group_order, own)


def across_groups(compressor, groups=None) -> CrossGroupCommunicator:
    """The communicator between hybrid `groups` (the strategy's
    :class:`~tfsyncmodes.exchange.groups.ActiveGroups`; None: a single group, nothing crosses)."""
    if groups is None:
        return cross_group(compressor, None, [0], 0)
    layout = groups.layout
    column = layout.column_of(groups.rank)
    order = [sorted(column).index(rank) for rank in column]
    if not compressor.sparse and groups.group_set is not None and groups.cross_set is not None:
        group = layout.groups[groups.group_index]
        return ShardedCrossGroupAllreduce(groups.cross_set, order, groups.group_index, groups.group_set,
                                          group.index(groups.rank), len(group))
    return cross_group(compressor, groups.cross_set, order, groups.group_index)


def across_world(compressor, world: Optional[Tuple[int, int]] = None) -> CrossGroupCommunicator:
    """The communicator in which every Horovod rank is a group of its own (sync mode's
    compressed exchange); `world`: (rank, size), Horovod's when None."""
    import horovod.tensorflow as hvd

    rank, size = world if world is not None else horovod_world()
    return cross_group(compressor, hvd.global_process_set, list(range(size)), rank)
