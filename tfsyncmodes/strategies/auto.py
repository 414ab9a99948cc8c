"""``--sync_mode=auto``: probe, pick a mode by :func:`tfsyncmodes.switching.auto.choose`, log
why in one line, and make that mode's strategy (whose config then names the chosen mode)."""
from __future__ import annotations

import dataclasses

from absl import logging

from tfsyncmodes.registry import MODES
from tfsyncmodes.strategies.base import Mode


@MODES.register("auto")
class AutoMode(Mode):
    def make_strategy(self, config, horovod, tf_config):
        from tfsyncmodes.switching import auto, candidates
        from tfsyncmodes.testing.faults import slow_spec

        if horovod is None:
            choice = auto.choose([0.0], 0.0, config.switch_threshold, 1)
        else:
            size = candidates.default_group_size(config, horovod.size)
            hvd = candidates.init_horovod(horovod.size, size)
            spec = slow_spec(config, hvd.rank())
            factor = spec.factor if spec is not None and spec.start == 0.0 else 1.0
            times, seconds = auto.probe(hvd, factor)
            choice = auto.choose(times, seconds, config.switch_threshold, size)
        if horovod is None or horovod.rank == 0:
            logging.info("%s", choice.reason)
        sources = dict(config.sources, mode="auto", switch_policy="auto", groups="auto")
        groups = ";".join(",".join(map(str, g)) for g in choice.groups) if choice.groups else config.groups
        chosen = dataclasses.replace(config, mode=choice.mode, switch_policy=choice.switch_policy,
                                     groups=groups, sources=sources)
        strategy = MODES.get(choice.mode)().make_strategy(chosen, horovod, tf_config)
        strategy.auto_choice = choice
        return strategy

    def exchange(self, config, strategy):
        return MODES.get(getattr(strategy, "mode", config.mode))().exchange(config, strategy)
