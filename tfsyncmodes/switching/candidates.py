"""The Horovod process sets a switch to hybrid may need, registered when Horovod starts.

The straggler policy chooses its groups only when it switches (the slow ranks share a group),
but Horovod 0.28 fixes its process sets at ``hvd.init`` unless dynamic process sets are on
(``HOROVOD_DYNAMIC_PROCESS_SETS=1``, where every ``add_process_set`` is another collective all
ranks must call in the same order). So every set any grouping into groups of `group_size` can
use is registered up front: every `group_size`-subset of the ranks (a group) and every
`world / group_size`-subset (a column, see :mod:`tfsyncmodes.exchange.groups`). For 4 ranks in
groups of 2 that is the 6 pairs; the count grows fast, so larger worlds are refused.
"""
from __future__ import annotations

import itertools
from typing import List, Tuple

from tfsyncmodes.errors import ConfigError

MAX_SETS = 64


def default_group_size(config, world_size: int) -> int:
    """The configured group size when it divides the world into 2 groups or more, else half."""
    size = 0 if config.group_size == "host" else config.group_size
    if size and world_size % size == 0 and size < world_size:
        return size
    return max(world_size // 2, 1)


def candidate_sets(world_size: int, group_size: int) -> List[Tuple[int, ...]]:
    """Every rank tuple a grouping of `world_size` ranks into groups of `group_size` can need."""
    if world_size % group_size:
        raise ConfigError("horovodrun", "-np", f"{group_size} does not divide the world size {world_size}",
                          "use a world size the group size divides, or set --sync_group_size")
    sizes = sorted({group_size, world_size // group_size})
    out = [c for size in sizes if 1 < size < world_size
           for c in itertools.combinations(range(world_size), size)]
    if len(out) > MAX_SETS:
        raise ConfigError("horovodrun", "-np", f"{world_size} ranks in groups of {group_size} need "
                          f"{len(out)} process sets for the straggler policy (at most {MAX_SETS})",
                          "use at most 8 ranks, or set --sync_group_size so that fewer sets are needed")
    return out


def init_horovod(world_size: int, group_size: int):
    """Initialises Horovod with every candidate process set (before anything else does)."""
    import horovod.tensorflow as hvd

    if not hvd.is_initialized():
        hvd.init(process_sets=[hvd.ProcessSet(list(ranks)) for ranks in candidate_sets(world_size, group_size)])
    return hvd
