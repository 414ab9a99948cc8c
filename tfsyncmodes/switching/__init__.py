"""Switching modes within one run (in-process, under ``horovodrun``: sync <-> hybrid).

A *switch plan* (registered in :data:`tfsyncmodes.registry.SWITCH_PLANS`) says whether a
run's configuration switches, between which modes, and which callbacks decide when:
``--sync_mode_schedule`` is the built-in plan (:mod:`tfsyncmodes.switching.plans`); an online
policy is another plan. When a plan is in force, ``make_strategy()`` makes a
:class:`~tfsyncmodes.strategies.scheduled.SwitchingStrategy` and every optimizer it wraps runs
a :class:`~tfsyncmodes.switching.exchange.SwitchableExchange` (one exchange per mode, all
their state optimizer state). The switch itself is
:meth:`tfsyncmodes.keras.switching.ModeSwitch.switch_to`, at a step boundary.

The online policy (``--sync_switch_policy=straggler``) and ``--sync_mode=auto``:

- :mod:`~tfsyncmodes.switching.decision`: the straggler policy's decision (pure, no TensorFlow).
- :mod:`~tfsyncmodes.switching.candidates`: the process sets every possible grouping needs,
  registered at ``hvd.init``.
- :mod:`~tfsyncmodes.switching.straggler`: the Keras callback that measures, exchanges and
  switches.
- :mod:`~tfsyncmodes.switching.auto`: ``--sync_mode=auto``'s rule (pure) and probe.

References: Sync-Switch (Li et al., ICDCS 2021, arXiv 2104.08364) switches a TensorFlow job
between synchronisation protocols within a run, by offline schedules and online policies;
PyTorch's post-local SGD (``PostLocalSGDState(start_localSGD_iter=...)``) is the fixed
schedule "global allreduce for a warm-up, then periodic averaging in subgroups".
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from tfsyncmodes import registry


def plan_for(config) -> Optional[Tuple[object, Tuple[str, ...]]]:
    """(plan, modes) of the first registered plan in force for `config`; None: the run stays
    in ``config.mode`` from start to end."""
    in_force = []
    for name in registry.SWITCH_PLANS.names():
        plan = registry.SWITCH_PLANS.get(name)()
        modes = tuple(plan.modes(config))
        if modes:
            in_force.append((name, plan, modes))
    if len(in_force) > 1:
        from tfsyncmodes.errors import ConfigError

        names = [name for name, _, _ in in_force]
        raise ConfigError("configuration", "switch plans", f"{' and '.join(names)} both decide when to "
                          "switch", "use one of them")
    return in_force[0][1:] if in_force else None


def mode_config(config, mode: str):
    """`config` as a run in `mode` alone would have it: ``mode`` set, and knobs left at their
    default take that mode's default (``Knob.mode_defaults``)."""
    from tfsyncmodes.knobs import KNOBS

    values = {"mode": mode}
    for knob in KNOBS:
        if knob.key != "mode" and config.sources.get(knob.key, "default") == "default":
            values[knob.key] = knob.default_for(mode)
    return dataclasses.replace(config, **values)


def mode_code(mode: str) -> int:
    """The number logs carry for a mode: its index in the mode registry (sync 0, async 1,
    hybrid 2)."""
    return registry.MODES.names().index(mode)
