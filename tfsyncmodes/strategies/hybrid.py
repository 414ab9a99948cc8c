"""Hybrid over Horovod: ranks form groups (Horovod process sets) that average densely every
step, while the groups keep in step across them as ``--sync_cross_group`` says.

Everything rank-related is Horovod's, as in sync mode, so this is :class:`HorovodStrategy`
with the groups set up before Horovod starts (process sets are declared at ``hvd.init``),
held by the strategy, and two more required callbacks.
"""
from __future__ import annotations

from typing import List, Optional

from absl import logging

from tfsyncmodes.cluster import HorovodEnv
from tfsyncmodes.config import SyncConfig, given_as
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange import groups as groups_lib
from tfsyncmodes.keras.hybrid_callbacks import DrainExchange
from tfsyncmodes.registry import MODES
from tfsyncmodes.strategies import elastic_hybrid, horovod_start
from tfsyncmodes.strategies.base import Mode
from tfsyncmodes.strategies.horovod import HorovodStrategy
from tfsyncmodes.strategies.sync import check_elastic


def start_groups(layout, dynamic: bool = False, timeouts=None) -> Optional[groups_lib.ActiveGroups]:
    """Starts Horovod with `layout`'s groups as process sets (None where Horovod is not
    installed: HorovodStrategy then reports it); `dynamic`: with dynamic process sets (elastic),
    Horovod started first as :func:`horovod_start.start` says with `timeouts`."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return None
    if dynamic and not hvd.is_initialized():
        horovod_start.start(hvd, timeouts, process_sets="dynamic")
    return groups_lib.init_horovod(layout, dynamic=dynamic)


class HybridStrategy(HorovodStrategy):
    mode = "hybrid"

    def __init__(self, config: SyncConfig, horovod_env: Optional[HorovodEnv]):
        if horovod_env is None:
            raise ConfigError(*given_as(config, "mode"), "hybrid: this process was not started by horovodrun",
                              "launch with: horovodrun -np N python ... --sync_mode=hybrid")
        if config.elastic:
            check_elastic(config, "horovod")
            if config.sources.get("local_steps", "default") != "default" and config.local_steps == "auto":
                raise ConfigError(*groups_lib.knob_field(config, "local_steps"), "auto cannot run in an elastic "
                                  "hybrid job (its commits count steps, which every rank must run alike)",
                                  "use fixed, or turn elastic off")
        self.layout = groups_lib.layout_from_config(config, horovod_env.size, horovod_env.local_size)
        one_group = groups_lib.one_group_line(self.layout, config)
        if one_group and horovod_env.rank == 0 and not config.elastic:  # (elastic: groups change with the world)
            logging.warning("%s", one_group)
        # Horovod starts here (process sets are declared at its start): its timeouts first.
        self.gloo_timeouts = horovod_start.gloo_timeouts(config)
        self._groups = start_groups(self.layout, dynamic=config.elastic, timeouts=self.gloo_timeouts)
        super().__init__(config)

    @property
    def groups(self) -> groups_lib.ActiveGroups:
        return self._groups

    @property
    def group_index(self) -> int:
        return self.layout.group_of(self.worker_index)

    # --- elastic (tfsyncmodes.strategies.elastic_hybrid) --------------------------------------

    def regrouped(self, layout: groups_lib.GroupLayout, groups: groups_lib.ActiveGroups) -> None:
        """`layout` and its process sets are this strategy's groups from now on."""
        self.layout, self._groups = layout, groups

    def elastic_restart(self, model) -> str:
        return " groups " + elastic_hybrid.restart(self, model)

    def elastic_commit_point(self, model) -> bool:
        return elastic_hybrid.at_round_boundary(model)

    def elastic_resized(self, model) -> None:
        elastic_hybrid.start_clean(model)

    def elastic_part_epoch(self, model, steps: int, done: int) -> None:
        elastic_hybrid.begin_part_epoch(model, steps, done)

    def _correctness_callbacks(self) -> List:
        return super()._correctness_callbacks() + [DrainExchange()]  # drain at the end

    def _counts_traffic(self) -> bool:
        return True

    def describe(self) -> str:
        return (super().describe() + f" groups={';'.join(','.join(map(str, g)) for g in self.layout.groups)}"
                f" group={self.group_index} compression={self.config.compression}"
                f" cross_group={self.config.cross_group} period={self.config.period} staleness={self.config.staleness}"
                f" warmup_steps={self.config.warmup_steps}")


@MODES.register("hybrid")
class HybridMode(Mode):
    def make_strategy(self, config, horovod, tf_config):
        return HybridStrategy(config, horovod)
