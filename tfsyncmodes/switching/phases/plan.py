"""Which epochs each phase of a launched mode schedule trains, and where the phases meet.

The launcher starts a new process layout for each phase, so phases meet at epoch ends: each
boundary of :func:`tfsyncmodes.schedule.phases` (in steps) is rounded to the nearest epoch end,
a phase keeps at least one epoch while epochs remain, and the last phase ends with the run.
Then every epoch is trained in one mode, and the History lists it once with that mode.

The launcher tells a phase's processes which phase they run through the environment
(``TFSYNC_PHASE``: its index, ``TFSYNC_PHASE_DIR``: the directory of the checkpoints and the
plan), so the training script's command line is the user's own. The first phase's chief
writes the plan (``phases.json``); the launcher reads it to start the next phases.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from typing import Dict, List, Mapping, Optional

from tfsyncmodes import schedule
from tfsyncmodes.errors import ConfigError

ENV_PHASE = "TFSYNC_PHASE"
ENV_DIR = "TFSYNC_PHASE_DIR"
PLAN_FILE = "phases.json"
HISTORY_FILE = "history.json"
LAUNCH_HINT = ("run it with python -m tfsyncmodes.launch --np N --workers N --ps 1 -- "
               "python scripts/train.py --sync_mode_schedule=...")


@dataclasses.dataclass(frozen=True)
class EpochPhase:
    """Phase `index` trains epochs [start_epoch, end_epoch) in `mode`."""

    index: int
    mode: str
    start_epoch: int
    end_epoch: int


def epoch_phases(text: str, epochs: int, steps_per_epoch: int) -> List[EpochPhase]:
    """The phases of schedule `text` over `epochs` epochs, at whole epochs (see above)."""
    spans = []
    start = 0
    steps = schedule.phases(text, epochs * steps_per_epoch, steps_per_epoch)
    for number, phase in enumerate(steps):
        end = epochs if number == len(steps) - 1 else math.floor(phase.end / steps_per_epoch + 0.5)
        end = min(epochs, max(end, start + 1))
        if end <= start:
            continue
        if spans and spans[-1][0] == phase.mode:
            spans[-1] = (phase.mode, spans[-1][1], end)
        else:
            spans.append((phase.mode, start, end))
        start = end
    return [EpochPhase(i, mode, a, b) for i, (mode, a, b) in enumerate(spans)]


def passes_through_async(text: str) -> bool:
    return bool(text) and "async" in schedule.modes(text)


def write_json(path: str, data) -> None:
    """Writes `data` as JSON to `path` through a temporary file renamed into place."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=".partial-", suffix=".json", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def read_json(path: str, default=None):
    if not os.path.isfile(path):
        return default
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


@dataclasses.dataclass(frozen=True)
class PhaseContext:
    """What one phase's processes know: the plan, their phase and the shared directory."""

    schedule: str
    phases: tuple
    index: int
    directory: str

    @property
    def phase(self) -> EpochPhase:
        return self.phases[self.index]

    @property
    def last(self) -> bool:
        return self.index == len(self.phases) - 1

    def checkpoint_in(self) -> Optional[str]:
        return os.path.join(self.directory, f"phase-{self.index - 1}.npz") if self.index else None

    def checkpoint_out(self) -> str:
        return os.path.join(self.directory, f"phase-{self.index}.npz")

    def plan_record(self) -> Dict[str, object]:
        return {"schedule": self.schedule,
                "phases": [dataclasses.asdict(p) for p in self.phases]}


def check_launched(config, environ: Optional[Mapping[str, str]] = None) -> None:
    """A schedule through async outside the launcher is a ConfigError (before any TensorFlow
    work: call it before making the strategy)."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV_PHASE) is None and passes_through_async(config.mode_schedule):
        raise ConfigError(config.sources.get("mode_schedule", "flag"), "mode_schedule",
                          f"{config.mode_schedule!r} passes through async, which runs on a cluster of its own",
                          LAUNCH_HINT)


def context(config, epochs: int, steps_per_epoch: int,
            environ: Optional[Mapping[str, str]] = None) -> Optional[PhaseContext]:
    """This process's phase, or None outside a launched schedule. A schedule through async
    outside the launcher, a phase index the plan does not have, or a plan that differs from
    the one the first phase wrote (other flags) is a ConfigError."""
    environ = os.environ if environ is None else environ
    text = config.mode_schedule
    check_launched(config, environ)
    raw = environ.get(ENV_PHASE)
    if raw is None:
        return None
    if not text:
        raise ConfigError(ENV_PHASE, "value", f"{raw!r} is set but no --sync_mode_schedule is given",
                          "unset it, or give --sync_mode_schedule")
    try:
        index = int(raw)
        if index < 0:
            raise ValueError
    except ValueError:
        raise ConfigError(ENV_PHASE, "value", f"{raw!r} is not a phase index", "use 0, 1, ...") from None
    directory = environ.get(ENV_DIR, "")
    if not directory:
        raise ConfigError(ENV_DIR, "value", "is unset", "set it to the phases' checkpoint directory")
    phases = tuple(epoch_phases(text, epochs, steps_per_epoch))
    if index >= len(phases):
        raise ConfigError(ENV_PHASE, "value", f"{index} is past the last phase ({len(phases) - 1}) of {text!r}",
                          f"use 0..{len(phases) - 1}")
    found = PhaseContext(text, phases, index, directory)
    if index:
        written = read_json(os.path.join(directory, PLAN_FILE))
        if written != found.plan_record():
            raise ConfigError(ENV_DIR, os.path.join(directory, PLAN_FILE),
                              f"plans other phases than this run's flags ({found.plan_record()['phases']})",
                              "run every phase with the same flags, through the launcher")
    if config.mode != found.phase.mode:
        raise ConfigError(config.sources.get("mode", "default"), "mode",
                          f"{config.mode!r} but phase {index} of {text!r} is {found.phase.mode!r}",
                          "give no --sync_mode with --sync_mode_schedule; the launcher sets each phase's mode")
    return found
