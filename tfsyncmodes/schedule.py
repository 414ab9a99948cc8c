"""``--sync_mode_schedule``: one run through several modes, one phase after the other.

Syntax: phases separated by commas, each ``MODE:LENGTH``; the last phase may omit its length
and runs to the end. A length is a fraction of the run's total steps (``10%``), a number of
epochs (``2e``) or a number of steps (``500``)::

    sync:10%,hybrid:80%,sync      warm up in sync, 80 % hybrid, finish in sync
    sync:2e,async                 two epochs of sync, then async to the end

:func:`parse` checks the text (the knob's parser, before TensorFlow is imported) and returns
its canonical form; :func:`phases` turns it into step ranges for a run of known length.
"""
from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Tuple

from tfsyncmodes import registry

FIX = ("write phases as MODE:LENGTH separated by commas, LENGTH a percentage of the run (10%), "
       "epochs (2e) or steps (500); the last phase may omit LENGTH, e.g. sync:10%,hybrid:80%,sync")


@dataclasses.dataclass(frozen=True)
class Phase:
    """Steps [start, end) of the run train in `mode`."""

    mode: str
    start: int
    end: int

    @property
    def steps(self) -> int:
        return self.end - self.start


def _length(text: str, spec: str) -> Tuple[float, str]:
    """(amount, unit) of one phase length: unit '%', 'e' (epochs) or 's' (steps)."""
    unit = text[-1] if text[-1:] in ("%", "e") else "s"
    number = text[:-1] if unit != "s" else text
    try:
        amount = float(number) if unit != "s" else int(number)
    except ValueError:
        raise ValueError(f"phase length {text!r} of {spec!r} is not a number", FIX) from None
    if not amount > 0 or (unit == "%" and amount > 100):
        raise ValueError(f"phase length {text!r} of {spec!r} is out of range", FIX)
    return amount, unit


def split(text: str) -> List[Tuple[str, Optional[Tuple[float, str]]]]:
    """The phases of a schedule as (mode, (amount, unit) or None for 'the rest')."""
    spec = str(text).strip()
    if not spec:
        return []
    out = []
    names = [n for n in registry.MODES.names() if getattr(registry.MODES.get(n), "schedulable", True)]
    parts = [p.strip() for p in spec.split(",")]
    for number, part in enumerate(parts):
        mode, colon, length = (s.strip() for s in part.partition(":"))
        mode = mode.lower()
        if mode not in names:
            raise ValueError(f"phase {number} of {spec!r} names mode {mode!r}",
                             "use modes among " + ", ".join(names))
        if not colon or not length:
            if number != len(parts) - 1:
                raise ValueError(f"phase {number} of {spec!r} has no length", FIX)
            out.append((mode, None))
        else:
            out.append((mode, _length(length, spec)))
    if len(out) < 2:
        raise ValueError(f"{spec!r} has one phase", "give two phases or more, or use --sync_mode alone")
    for (a, _), (b, _) in zip(out, out[1:]):
        if a == b:
            raise ValueError(f"{spec!r} has two {a} phases in a row", "merge them into one phase")
    percent = sum(length[0] for _, length in out if length and length[1] == "%")
    if percent > 100 + 1e-9:
        raise ValueError(f"the percentages of {spec!r} add up to {percent:g} %", FIX)
    return out


def parse(text) -> str:
    """The knob's parser: the canonical text of a valid schedule ('' for none)."""
    def fmt(length):
        amount, unit = length
        return f"{amount:g}%" if unit == "%" else (f"{amount:g}e" if unit == "e" else str(amount))
    return ",".join(mode if length is None else f"{mode}:{fmt(length)}" for mode, length in split(text))


def modes(text: str) -> Tuple[str, ...]:
    """The distinct modes a schedule passes through, in order of first use."""
    return tuple(dict.fromkeys(mode for mode, _ in split(text)))


def phases(text: str, total_steps: int, steps_per_epoch: int) -> List[Phase]:
    """Step ranges of the schedule over a run of `total_steps` (phases that get no step are
    left out; a phase that would run past the end is cut at the end)."""
    out, start = [], 0
    for mode, length in split(text):
        if length is None:
            end = total_steps
        else:
            amount, unit = length
            count = {"%": lambda: math.floor(amount / 100.0 * total_steps + 0.5),
                     "e": lambda: math.floor(amount * steps_per_epoch + 0.5),
                     "s": lambda: int(amount)}[unit]()
            end = min(total_steps, start + count)
        if end > start:
            if out and out[-1].mode == mode:
                out[-1] = Phase(mode, out[-1].start, end)
            else:
                out.append(Phase(mode, start, end))
        start = end
    if start < total_steps and out:  # lengths that leave steps over: the last phase runs on
        out[-1] = Phase(out[-1].mode, out[-1].start, total_steps)
    return out


def mode_at(schedule: List[Phase], step: int) -> str:
    """The mode of the phase `step` (0-based) falls in."""
    for phase in schedule:
        if phase.start <= step < phase.end:
            return phase.mode
    return schedule[-1].mode
