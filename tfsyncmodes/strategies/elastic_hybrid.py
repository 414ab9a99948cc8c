"""Elastic hybrid (``--sync_elastic`` with ``--sync_mode=hybrid``): what hybrid adds to the elastic
loop of :mod:`tfsyncmodes.strategies.elastic`.

- **Groups on every new world.** Horovod drops its process sets when it shuts down, and an
  elastic reset shuts it down; so Horovod runs with dynamic process sets, and after each reset
  the groups are made again from the new world (``--sync_group_size=host``: one group per host,
  from Horovod's new local size; a number: ranks in groups of that size), their process sets
  added (the same calls in the same order on every rank), and the optimizer's exchange built
  again over them, over the same state variables (the commit knows them by name).
- **Commits at round boundaries.** A step commit waits for the first step after which no
  cross-group round is under way (periodic and elastic averaging: every ``period``-th update;
  speed-proportional steps: the end of a round), so that a rollback lands where every group
  holds the model the round gave and the other groups' progress is not lost.
- **The exchange's state on a new world.** After Horovod's ``sync`` every rank holds rank 0's
  committed state; then the exchange starts clean, as after a mode switch: its state variables
  are set to zero on every rank except the traffic counters, so the anchor (elastic: the
  center) is taken again from the committed weights at the next step, error-feedback residuals
  start empty (they held what the old groups' compressors had not sent, which belongs to no new
  group), and the round counter is 0 on every rank (the round schedule, and a warm-up, start
  again with the new groups).
"""
from __future__ import annotations

from tfsyncmodes.exchange import groups as groups_lib
from tfsyncmodes.exchange.policies import CrossGroupPolicy
from tfsyncmodes.exchange.switchable import KEPT_STATE
from tfsyncmodes.strategies import horovod_start


def layout_text(layout: groups_lib.GroupLayout) -> str:
    """``[[0,1],[2,3]]``: the groups as the world-change line shows them."""
    return "[" + ",".join("[" + ",".join(map(str, g)) + "]" for g in layout.groups) + "]"


def _cores(model):
    """The sync cores of the model's wrapped optimizer (none: not wrapped)."""
    core = getattr(getattr(model, "optimizer", None), "sync_core", None)
    return [] if core is None else [core]


def restart(strategy, model) -> str:
    """After ``hvd.shutdown()``: Horovod started again with dynamic process sets, the groups of
    the new world made, their process sets added and the model's exchange rebuilt over them.
    Returns the groups, for the world-change line."""
    hvd = strategy.hvd
    horovod_start.start(hvd, strategy.gloo_timeouts, process_sets="dynamic")
    layout = groups_lib.layout_from_config(strategy.config, hvd.size(), hvd.local_size())
    groups = groups_lib.init_horovod(layout, dynamic=True)  # adds the layout's process sets
    strategy.regrouped(layout, groups)
    for core in _cores(model):
        core.regroup(groups)
    return layout_text(layout)


def at_round_boundary(model) -> bool:
    """Whether no cross-group round of the model's exchange is under way."""
    exchange = getattr(getattr(model, "optimizer", None), "exchange", None)
    policies = [] if exchange is None else exchange.find(CrossGroupPolicy)
    return all(policy.at_round_boundary() for policy in policies if policy.active)


def start_clean(model) -> None:
    """The exchange's state set to zero on every rank but the traffic counters (module doc)."""
    for core in _cores(model):
        core.start_clean(KEPT_STATE)


def begin_part_epoch(model, steps: int, done: int) -> None:
    """A resumed epoch begins at step `done` of `steps`: the cross-group policies plan the steps
    left (speed-proportional steps count them), as after a switch into hybrid mid-epoch."""
    exchange = getattr(getattr(model, "optimizer", None), "exchange", None)
    for policy in [] if exchange is None else exchange.find(CrossGroupPolicy):
        if policy.active:
            policy.begin_epoch(steps, done=done)
