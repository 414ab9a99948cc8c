"""Horovod started for a run whose hybrid groups are chosen only when it switches.

The straggler policy chooses its groups at the switch (the run's hosts, or the slow ranks in one
group), so Horovod starts with dynamic process sets (``hvd.init(process_sets="dynamic")``) and
registers none: the strategy adds the chosen groups' sets at the first switch to hybrid (every
rank, in the same order, at the same step boundary; see
:meth:`~tfsyncmodes.switching.strategy.SwitchingStrategy.regroup`). A registered set costs each of
its ranks one more negotiation in every cycle of Horovod's background loop, so a run that never
switches pays for none, and any world size works (registering every set a grouping might need
grew as the binomial of the world size).
"""
from __future__ import annotations

import os

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.strategies import horovod_start


def default_group_size(config, world_size: int) -> int:
    """The configured group size when it divides the world into 2 groups or more, else half."""
    size = 0 if config.group_size == "host" else config.group_size
    if size and world_size % size == 0 and size < world_size:
        return size
    return max(world_size // 2, 1)


def init_horovod(timeouts=None):
    """Starts Horovod with dynamic process sets and none registered (before anything else does);
    `timeouts`: as :func:`tfsyncmodes.strategies.horovod_start.start` takes them."""
    import horovod.tensorflow as hvd

    if not hvd.is_initialized():
        horovod_start.start(hvd, timeouts, process_sets="dynamic")
    elif os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") != "1":
        raise ConfigError("horovod", "process sets", "Horovod was initialised without dynamic process "
                          "sets, which the switch policy adds its hybrid groups with",
                          "call make_strategy() before hvd.init(), or hvd.init(process_sets='dynamic')")
    return hvd
