"""``--sync_mode=auto``: under horovodrun with more than one rank, a run in sync under the auto
policy (:mod:`tfsyncmodes.switching.auto_policy`: it profiles the first steps, prices the modes
and switches to hybrid if that pays); else sync, which has nothing to choose between."""
from __future__ import annotations

import dataclasses

from absl import logging

from tfsyncmodes.config import with_mode_defaults
from tfsyncmodes.knobs import KNOBS
from tfsyncmodes.registry import MODES
from tfsyncmodes.strategies import make_strategy
from tfsyncmodes.strategies.base import Mode


@MODES.register("auto")
class AutoMode(Mode):
    schedulable = False  # it picks a mode; a --sync_mode_schedule names the modes themselves

    def make_strategy(self, config, horovod, tf_config):
        if horovod is None or horovod.size <= 1:
            policy = "none"
            if horovod is None or horovod.rank == 0:
                logging.info("auto: sync: %s", "not under horovodrun, where the profile and in-process switching "
                             "run (sync's backend: as --sync_backend says)" if horovod is None
                             else "one process (nothing to exchange)")
        else:
            policy = "auto"
        return make_strategy(config=dataclasses.replace(config, **_settings(config, policy)))


def _settings(config, policy: str) -> dict:
    """The knobs auto sets: sync, the policy, and sync's own defaults for knobs left at their
    default (:func:`tfsyncmodes.config.with_mode_defaults`)."""
    chosen = with_mode_defaults(config, "sync")
    settings = {knob.key: getattr(chosen, knob.key) for knob in KNOBS
                if config.sources.get(knob.key, "default") == "default"}
    settings.update(mode="sync", switch_policy=policy)
    settings["sources"] = dict(config.sources, mode="auto", switch_policy="auto")
    return settings
