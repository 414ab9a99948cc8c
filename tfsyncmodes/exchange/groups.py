"""Hybrid groups: which Horovod ranks average densely every step, and the process sets that
carry the exchange inside and across groups.

Ranks of one group hold the same dense group average after the intra-group allreduce, so the
cross-group exchange needs only one rank per group. Every rank still takes part: rank j of
each group joins the *column* process set {group[j] for every group}, and the columns run in
parallel. A dense payload goes in slices: column j averages the j-th slice, and each group
gathers its slices (:class:`~tfsyncmodes.exchange.communicators.ShardedCrossGroupAllreduce`),
so a host's link carries one payload a round; a sparse one (Top-K, quantized) goes whole in
every column. That keeps all ranks busy and needs no broadcast back into the group. Because columns pair up the j-th members, groups must be equally sized;
with equal sizes the mean over groups of the group means is also the mean over all ranks.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.knobs import KNOBS_BY_KEY


def knob_field(config, key: str) -> Tuple[str, str]:
    """(source, field) of a knob as ConfigError names them: the flag or env var if given so."""
    knob = KNOBS_BY_KEY[key]
    source = config.sources.get(key, "default")
    return source, {"environment": knob.env, "flag": "--" + knob.flag}.get(source, key)


@dataclasses.dataclass(frozen=True)
class GroupLayout:
    """Groups of ranks (each a sorted tuple) covering ranks 0..world_size-1 exactly once."""

    groups: Tuple[Tuple[int, ...], ...]

    @property
    def world_size(self) -> int:
        return sum(len(g) for g in self.groups)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def group_size(self) -> int:
        return len(self.groups[0])

    def group_of(self, rank: int) -> int:
        return next(i for i, g in enumerate(self.groups) if rank in g)

    def column_of(self, rank: int) -> Tuple[int, ...]:
        """The ranks that carry this rank's cross-group exchange: its peers at the same
        position in every group, ordered by group."""
        position = self.groups[self.group_of(rank)].index(rank)
        return tuple(g[position] for g in self.groups)

    def process_set_ranks(self):
        """Every rank list that needs its own Horovod process set (not the world, not one
        rank), deduplicated and in one order on every rank."""
        lists = [sorted(g) for g in self.groups]
        lists += [sorted(self.column_of(r)) for r in self.groups[0]]
        out = []
        for ranks in lists:
            if 1 < len(ranks) < self.world_size and ranks not in out:
                out.append(ranks)
        return out


def layout_from_config(config, world_size: int, local_size: int) -> GroupLayout:
    """The groups `config` asks for, checked against the world; ConfigError if they do not fit."""
    if config.groups:
        source, field = knob_field(config, "groups")
        groups = tuple(tuple(sorted(int(r) for r in part.split(","))) for part in config.groups.split(";"))
        ranks = sorted(r for g in groups for r in g)
        missing = sorted(set(range(world_size)) - set(ranks))
        extra = [r for r in ranks if r >= world_size]
        if extra:
            raise ConfigError(source, field, f"rank {extra[0]} does not exist in a world of {world_size}",
                              f"use ranks 0..{world_size - 1}")
        if missing:
            raise ConfigError(source, field, f"rank {missing[0]} is in no group",
                              f"list every rank 0..{world_size - 1} exactly once")
        if len({len(g) for g in groups}) > 1:
            raise ConfigError(source, field,
                              f"groups have different sizes ({', '.join(str(len(g)) for g in groups)})",
                              "give every group the same number of ranks")
        return GroupLayout(tuple(sorted(groups)))
    size = local_size if config.group_size == "host" else config.group_size
    source, field = knob_field(config, "group_size")
    if config.group_size == "host":
        source, field = "horovodrun", "local_size (one group per host)"
    if world_size % size:
        raise ConfigError(source, field, f"{size} does not divide the world size {world_size}",
                          f"use a divisor of {world_size}, or list groups with --sync_groups")
    return GroupLayout(tuple(tuple(range(s, s + size)) for s in range(0, world_size, size)))


def one_group_line(layout: GroupLayout, config) -> Optional[str]:
    """The line a run's chief logs when hybrid's groups are one group of every rank (nothing
    then crosses groups: each step is one dense allreduce, as in sync); None otherwise."""
    if layout.num_groups > 1 or layout.world_size < 2:
        return None
    if config.groups:
        why = "the groups listed are one"
    else:
        why = "one group per host, on one host" if config.group_size == "host" else f"group size {layout.world_size}"
    return (f"tfsyncmodes: hybrid: one group of all {layout.world_size} ranks ({why}): every step is one dense "
            "allreduce, as in sync; set --sync_group_size (e.g. 2) or --sync_groups for groups that exchange "
            "across")


@dataclasses.dataclass(frozen=True)
class ActiveGroups:
    """The layout of this run and this rank's Horovod process sets (None: no peers there)."""

    layout: GroupLayout
    rank: int
    group_set: object
    cross_set: object

    @property
    def group_index(self) -> int:
        return self.layout.group_of(self.rank)


def _registered_sets():
    """Horovod's own table of the process sets it knows: sorted rank tuple -> ProcessSet."""
    from horovod.common.process_sets import _temp_process_set_object
    from horovod.tensorflow.mpi_ops import _basics

    return {tuple(sorted(ranks)): _temp_process_set_object(set_id)
            for set_id, ranks in _basics._get_process_set_ids_and_ranks().items()}


def init_horovod(layout: GroupLayout, dynamic: bool = False) -> ActiveGroups:
    """Initialises Horovod with the layout's process sets (identically on every rank), and
    returns this rank's groups and process sets. The process sets are Horovod's: a second
    strategy with the same layout finds them there. `dynamic`: Horovod is started with
    dynamic process sets and the layout's are added after (an elastic job, whose sets are
    made again for every new world: Horovod drops them when it shuts down)."""
    import horovod.tensorflow as hvd

    wanted = [tuple(r) for r in layout.process_set_ranks()]
    if not hvd.is_initialized():
        hvd.init(process_sets="dynamic" if dynamic else [hvd.ProcessSet(list(ranks)) for ranks in wanted])
    known = _registered_sets()
    for ranks in wanted:
        if ranks in known:
            continue
        try:
            known[ranks] = hvd.add_process_set(list(ranks))
        except Exception as error:  # Horovod raises ValueError or RuntimeError here
            raise ConfigError("horovod", "process sets",
                              f"Horovod was initialised without the hybrid groups ({error})",
                              "call make_strategy('hybrid') before hvd.init(), or set "
                              "HOROVOD_DYNAMIC_PROCESS_SETS=1") from None
    if hvd.size() != layout.world_size:
        raise ConfigError("horovodrun", "-np", f"the groups cover {layout.world_size} ranks but "
                          f"the world has {hvd.size()}", "make the groups cover every rank")
    rank = hvd.rank()

    def process_set(ranks):
        ranks = tuple(sorted(ranks))
        if len(ranks) <= 1:
            return None
        if len(ranks) == layout.world_size:
            return hvd.global_process_set
        return known[ranks]

    return ActiveGroups(layout, rank, process_set(layout.groups[layout.group_of(rank)]),
                        process_set(layout.column_of(rank)))
