"""absl flags for every knob in :data:`tfsyncmodes.knobs.KNOBS`: ``--sync_<key>``, plus
``--sync_config`` (a YAML file of knobs).

The flags are typed with the knob's own parser: booleans are absl booleans (``--sync_X``,
``--nosync_X``, ``--sync_X=false``: absl puts ``no`` before the whole flag name), choices list
their values, numbers their bounds or words. A bad value is the same one-line ``ConfigError``
as from any other source. :func:`tfsyncmodes.config.resolve` reads only the flags given on the
command line, so a flag's default never hides a config file or an environment variable.

Importing this module defines them on absl's FLAGS. A name another module defined first stays
that module's: it is not adopted, one line says so, and that knob is read from this module's own
parse of the command line (:func:`parse_known`), as every knob is in a program that never
parses absl flags (argparse, or none).
"""
from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Sequence, Tuple

from absl import flags, logging

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.knobs import ENV_PREFIX, FLAG_PREFIX, KNOBS, Knob

CONFIG_FLAG = FLAG_PREFIX + "config"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
_CONFIG_HELP = f"YAML file of tfsyncmodes knobs (see configs/). [env {CONFIG_ENV}]"
# Flag names another module had defined on absl's FLAGS when this module was imported.
TAKEN: Tuple[str, ...] = ()


def _problem(error: ValueError) -> Tuple[str, Optional[str]]:
    return error.args if len(error.args) == 2 else (str(error), None)


def help_text(knob: Knob) -> str:
    """The flag's help: what the knob does, its per-mode defaults, when it applies, its
    environment variable and config key (absl adds the default and the accepted syntax)."""
    parts = [knob.help]
    if knob.mode_defaults:
        parts.append(f"Default {knob.default}; " + "; ".join(f"{m}: {d}" for m, d in knob.mode_defaults) + ".")
    if knob.applies.modes or knob.applies.test:
        parts.append(f"Applies with {knob.applies.depends}.")
    parts.append(f"[env {knob.env}; config key {knob.key}]")
    text = " ".join(parts)
    return f"<{'|'.join(knob.parse.choices)}>: {text}" if knob.parse.kind == "enum" else text


class _Parsing:
    """Parses a flag's text with its knob's parser; a bad value is a ConfigError."""

    def __init__(self, knob: Knob):
        self.knob = knob
        # What it accepts (a choice's values are in its help already, as absl's enums show them).
        self.syntactic_help = knob.parse.syntax if knob.parse.kind == "text" else ""

    def parse(self, argument: Any) -> Any:
        try:
            return self.knob.parse(argument)
        except ValueError as error:
            raise ConfigError("flag", "--" + self.knob.flag, *_problem(error)) from None

    def flag_type(self) -> str:
        return {"bool": "bool", "enum": "string enum"}.get(self.knob.parse.kind, "string")


class _KnobParser(_Parsing, flags.ArgumentParser):
    pass


class _BooleanKnobParser(_Parsing, flags.BooleanParser):
    pass


def _flag(knob: Knob) -> flags.Flag:
    boolean = knob.parse.kind == "bool"
    parser = (_BooleanKnobParser if boolean else _KnobParser)(knob)
    return flags.Flag(parser, None if boolean else flags.ArgumentSerializer(), knob.flag, knob.default,
                      help_text(knob), boolean=boolean)


def define(values: flags.FlagValues) -> Tuple[str, ...]:
    """Defines ``--sync_config`` and one typed flag per knob on `values`, except names
    `values` has already (another module's flags), which it returns."""
    taken = []
    if CONFIG_FLAG in values:
        taken.append(CONFIG_FLAG)
    else:
        flags.DEFINE_string(CONFIG_FLAG, None, _CONFIG_HELP, flag_values=values, module_name=__name__)
    for knob in KNOBS:
        if knob.flag in values:
            taken.append(knob.flag)
        else:
            flags.DEFINE_flag(_flag(knob), values, module_name=__name__)
    return tuple(taken)


def _report_taken(values: flags.FlagValues, names: Sequence[str]) -> None:
    by_flag = {knob.flag: knob for knob in KNOBS}
    for name in names:
        knob = by_flag.get(name)
        what = f"knob {knob.key}" if knob else "config file"
        # A --name on the command line sets tfsyncmodes' value whoever defined the flag, above
        # the environment and the config file: renaming the script's flag is the one way apart.
        logging.warning(
            "tfsyncmodes: --%s is defined by %s and by %s: FLAGS keeps the first, and tfsyncmodes "
            "reads its %s from its own parse of the command line, so a --%s given there sets both; "
            "to keep them apart, rename your flag", name, values.find_module_defining_flag(name, "another module"),
            __name__, what, name)

def parse_known(argv: Sequence[str]) -> flags.FlagValues:
    """tfsyncmodes' flags from `argv` (program name first), every other argument left alone."""
    values = flags.FlagValues()
    define(values)
    try:
        values(list(argv), known_only=True)
    except flags.Error as error:
        if isinstance(error.__context__, ConfigError):
            raise error.__context__ from None
        raise ConfigError("flag", "(command line)", str(error), "see --helpfull") from None
    return values


def command_line() -> Dict[str, Any]:
    """Knob values given on the command line, by knob key (``config``: the config file).

    From absl's FLAGS when the program parsed them (``absl.app.run``, ``tfsyncmodes.run``),
    except names another module defined; those, and every knob of a program that never parsed
    absl flags, from :func:`parse_known` of ``sys.argv``.
    """
    parsed = flags.FLAGS.is_parsed()
    private = parse_known(sys.argv) if TAKEN or not parsed else None
    given = {}
    for key, name in [("config", CONFIG_FLAG)] + [(knob.key, knob.flag) for knob in KNOBS]:
        values = flags.FLAGS if parsed and name not in TAKEN else private
        if values[name].present:
            given[key] = values[name].value
    return given


TAKEN = define(flags.FLAGS)
_report_taken(flags.FLAGS, TAKEN)
