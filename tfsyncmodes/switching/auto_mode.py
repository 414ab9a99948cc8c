"""``--sync_mode=auto``: probe, pick a mode by :func:`tfsyncmodes.switching.auto.choose`, log
each mode's predicted rate and the pick (a line each), and make that mode's strategy (whose config then names the chosen mode)."""
from __future__ import annotations

import dataclasses

from absl import logging

from tfsyncmodes.config import with_mode_defaults
from tfsyncmodes.knobs import KNOBS
from tfsyncmodes.registry import MODES
from tfsyncmodes.strategies import make_strategy
from tfsyncmodes.strategies.base import Mode
from tfsyncmodes.switching import auto, candidates
from tfsyncmodes.faults import slow_spec


@MODES.register("auto")
class AutoMode(Mode):
    schedulable = False  # it picks a mode; a --sync_mode_schedule names the modes themselves

    def make_strategy(self, config, horovod, tf_config):
        if horovod is None:
            choice = auto.Choice("sync", "none", (), "auto: sync: not under horovodrun, where the probe "
                                 "and in-process switching run (sync's backend: as --sync_backend says)")
        else:
            size = candidates.default_group_size(config, horovod.size)
            hvd = candidates.init_horovod(horovod.size, size)
            spec = slow_spec(config, hvd.rank())
            factor = spec.factor if spec is not None and spec.start == 0.0 else 1.0
            times, seconds, sigma = auto.probe(factor)
            hybrid = with_mode_defaults(config, "hybrid")
            choice = auto.choose(times, seconds, config.switch_threshold, size, period=hybrid.period,
                                 local_steps=hybrid.local_steps, tail_sigma=sigma)
        if horovod is None or horovod.rank == 0:
            for line in choice.prediction_lines():
                logging.info("%s", line)
            logging.info("%s", choice.reason)
        chosen = dataclasses.replace(config, **_settings(config, choice, horovod))
        strategy = make_strategy(config=chosen)  # a switch policy, if chosen, is a plan
        strategy.auto_choice = choice
        return strategy


def _settings(config, choice, horovod) -> dict:
    """The knobs the choice sets: the mode, the policy, the groups, and the chosen mode's own
    defaults for knobs left at their default (:func:`tfsyncmodes.config.with_mode_defaults`)."""
    chosen = with_mode_defaults(config, choice.mode)
    settings = {knob.key: getattr(chosen, knob.key) for knob in KNOBS
                if config.sources.get(knob.key, "default") == "default"}
    settings.update(mode=choice.mode, switch_policy=choice.switch_policy)
    sources = dict(config.sources, mode="auto", switch_policy="auto")
    if choice.groups:
        settings["groups"] = ";".join(",".join(map(str, g)) for g in choice.groups)
        sources["groups"] = "auto"
    elif (choice.mode == "hybrid" and not config.groups and config.group_size == "host" and horovod is not None
          and horovod.local_size == horovod.size):  # one host: two halves, not one group
        settings["group_size"] = max(horovod.size // 2, 1)
        sources["group_size"] = "auto"
    settings["sources"] = sources
    return settings
