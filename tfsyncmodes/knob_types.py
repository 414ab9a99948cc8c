"""What a knob is (:class:`Knob`), its parsers, and when it applies.

One parser per knob serves every source: a flag, a ``TFSYNC_*`` variable, a config-file key, a
code argument, a saved optimizer. A parser takes the raw value (text, or a YAML / Python value)
and returns the knob's value, or raises ``ValueError(problem, fix)``, which
:func:`tfsyncmodes.config.resolve` turns into a one-line ``ConfigError``. A parser accepts its
own output (absl parses a flag with it, and resolve parses the result again). It also says what
its flag looks like: ``kind`` (``bool``, ``enum`` or ``text``), ``choices`` and ``syntax``.

Knobs that can be switched off, or whose value can be derived, take a word instead of a number
that means something else (``off``, ``auto``, ``host``); the old numeric sentinels are refused
with the word to use.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from tfsyncmodes.errors import one_of
from tfsyncmodes import schedule as schedule_lib


class Parser:
    """Base: any text, as given."""

    kind = "text"  # how its flag is defined: "bool" (absl boolean), "enum" or "text"
    syntax = ""  # what is accepted, as the flag's help shows it

    def __call__(self, value: Any) -> Any:
        return str(value).strip()


class Boolean(Parser):
    kind, syntax = "bool", "true or false"

    def __call__(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{value!r} is not a boolean", "use true or false")


class Choice(Parser):
    """One of the names `choices()` gives (read when parsing: a registry's names);
    `refuse(text)` may name an old value's replacement as (problem, fix)."""

    kind = "enum"

    def __init__(self, choices: Callable[[], Sequence[str]],
                 refuse: Optional[Callable[[str], Optional[Tuple[str, str]]]] = None):
        self._choices, self._refuse = choices, refuse

    @property
    def choices(self) -> Tuple[str, ...]:
        return tuple(self._choices())

    @property
    def syntax(self) -> str:
        return "one of: " + ", ".join(self.choices)

    def __call__(self, value: Any) -> str:
        text = str(value).strip().lower()
        if text in self.choices:
            return text
        refused = self._refuse(text) if self._refuse else None
        if refused:
            raise ValueError(*refused)
        raise ValueError(f"{value!r} is not accepted", one_of(self.choices))


class Number(Parser):
    """An int or a float in [low, high] (low excluded with `above`), or one of `words`;
    `old` maps numbers that used to stand for a word to that word (refused, naming it)."""

    def __init__(self, kind: type, low: float, high: float, *, above: bool = False,
                 words: Tuple[str, ...] = (), old: Optional[Mapping[float, str]] = None):
        self.type, self.low, self.high, self.above = kind, low, high, above
        self.words, self.old = words, dict(old or {})

    @property
    def syntax(self) -> str:
        name = "an integer" if self.type is int else "a number"
        number = f"{name} in {'(' if self.above else '['}{self._text(self.low)}, {self._text(self.high)}]"
        return " or ".join(self.words + (number,))

    def _text(self, number: float) -> str:
        return str(int(number)) if self.type is int else f"{number:g}"

    def __call__(self, value: Any) -> Any:
        fix = "use " + self.syntax
        if isinstance(value, bool):  # YAML reads a bare off / no as false
            if not value and "off" in self.words:
                return "off"
            raise ValueError(f"{value!r} is not a number", fix)
        text = str(value).strip().lower()
        if text in self.words:
            return text
        name = "an integer" if self.type is int else "a number"
        try:
            if isinstance(value, float) and self.type is int:
                if not value.is_integer():
                    raise ValueError
                number = int(value)
            else:
                number = self.type(value if isinstance(value, (int, float)) else text)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{value!r} is not {name}", fix) from None
        if number in self.old:
            word = self.old[number]
            raise ValueError(f"{value!r} is not accepted any more (it meant {word})", fix)
        inside = (self.low < number if self.above else self.low <= number) and number <= self.high
        if not inside:
            raise ValueError(f"{self._text(number)} is out of range", fix)
        return number


def rank_groups(value: Any) -> str:
    """Explicit hybrid groups, '0,1;2,3' or a list of lists, as canonical text ('' = none)."""
    fix = "give groups of Horovod ranks separated by ';', ranks by ',', e.g. 0,1;2,3"
    if isinstance(value, (list, tuple)):
        groups = [list(g) if isinstance(g, (list, tuple)) else [g] for g in value]
    else:
        text = str(value).strip()
        if not text:
            return ""
        groups = [[r for r in part.split(",") if r.strip()] for part in text.split(";")]
    seen: Dict[int, int] = {}
    for number, group in enumerate(groups):
        if not group:
            raise ValueError(f"group {number} of {value!r} is empty", fix)
        for rank in group:
            try:
                rank = int(str(rank).strip())
                if rank < 0:
                    raise ValueError
            except ValueError:
                raise ValueError(f"{rank!r} in {value!r} is not a rank (an integer >= 0)", fix) from None
            if rank in seen:
                raise ValueError(f"rank {rank} is in group {seen[rank]} and group {number}",
                                 "put every rank in exactly one group")
            seen[rank] = number
    return ";".join(",".join(str(int(str(r).strip())) for r in g) for g in groups)


def slow_worker(value: Any) -> str:
    """'INDEX:FACTOR' (slow the whole run) or 'INDEX:FACTOR@START%-END%' (slow only while the
    run's step is in [START %, END %) of its steps), as canonical text ('' = off)."""
    text = str(value).strip()
    if not text:
        return ""
    fix = ("use INDEX:FACTOR with INDEX >= 0 and FACTOR >= 1, e.g. 1:4.0, optionally with a "
           "window of the run's steps, e.g. 1:4.0@30%-60%")
    head, at, window = text.partition("@")
    index, _, factor = head.partition(":")
    try:
        if int(index) < 0 or not float(factor) >= 1.0 or float(factor) == float("inf"):
            raise ValueError
        if at:
            start, dash, end = (part.strip() for part in window.partition("-"))
            if not dash or not start.endswith("%") or not end.endswith("%"):
                raise ValueError
            start, end = float(start[:-1]), float(end[:-1])
            if not 0.0 <= start < end <= 100.0:
                raise ValueError
    except ValueError:
        raise ValueError(f"{value!r} is not accepted", fix) from None
    canonical = f"{int(index)}:{float(factor)}"
    return canonical + (f"@{start:g}%-{end:g}%" if at else "")


def schedule(value: Any) -> str:

    return schedule_lib.parse(value)


class Text(Parser):
    """Free-form text checked (and made canonical) by `parse`."""

    def __init__(self, parse: Callable[[Any], Any], syntax: str):
        self._parse, self.syntax = parse, syntax

    def __call__(self, value: Any) -> Any:
        return self._parse(value)


@dataclasses.dataclass(frozen=True)
class When:
    """When a knob applies: in `modes` (empty: every mode) and when `test(values, mode)` holds
    of the resolved values; `text` says what it depends on, `keys` the knobs that decide it."""

    modes: Tuple[str, ...] = ()
    test: Optional[Callable[[Mapping[str, Any], str], bool]] = None
    text: str = ""
    keys: Tuple[str, ...] = ()

    def __call__(self, values: Mapping[str, Any], mode: str) -> bool:
        return (not self.modes or mode in self.modes) and (self.test is None or bool(self.test(values, mode)))

    @property
    def depends(self) -> str:
        return self.text or "mode=" + " or ".join(self.modes)

    @property
    def deciding(self) -> Tuple[str, ...]:
        return (("mode",) if self.modes else ()) + self.keys


ALWAYS = When()


def modes(*names: str) -> When:
    """Applies in these modes."""
    return When(modes=names)


def given(key: str, *accepted: str, modes: Tuple[str, ...] = ("hybrid",), text: str = "") -> When:
    """Applies in `modes` when knob `key` is one of `accepted`."""
    return When(modes=modes, test=lambda values, mode: values[key] in accepted,
                text=text or f"{key}={' or '.join(accepted)}", keys=(key,))


ENV_PREFIX = "TFSYNC_"
FLAG_PREFIX = "sync_"


@dataclasses.dataclass(frozen=True)
class Knob:
    """A configuration value: its key, default, parser, help and when it applies."""

    key: str
    default: Any
    parse: Parser
    help: str
    applies: When = ALWAYS
    mode_defaults: Tuple[Tuple[str, Any], ...] = ()  # (mode, default) where a mode's differs

    @property
    def flag(self) -> str:
        return FLAG_PREFIX + self.key

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def modes(self) -> Tuple[str, ...]:
        """The modes it can apply in (empty: every mode)."""
        return self.applies.modes

    def default_for(self, mode: str) -> Any:
        return dict(self.mode_defaults).get(mode, self.default)

    def used_by(self, mode: str) -> bool:
        return not self.modes or mode in self.modes
