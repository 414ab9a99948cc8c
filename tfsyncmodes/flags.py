"""absl flags for every knob in :data:`tfsyncmodes.config.KNOBS`, plus ``--config``.

Importing this module defines them on absl's FLAGS; :func:`tfsyncmodes.config.resolve`
reads only the ones given on the command line, so a flag's default never hides a config file
or an environment variable. A program that never parses absl flags still gets its
tfsyncmodes flags read, by :func:`parse_known`.
"""
from typing import Sequence

from absl import flags

from tfsyncmodes.config import KNOBS


def _help(knob) -> str:
    choices = getattr(knob.parse, "choices", None)
    accepted = f" One of: {', '.join(choices())}." if choices else ""
    return f"{knob.help}{accepted} [env {knob.env}]"


def define(values: flags.FlagValues) -> flags.FlagValues:
    """Defines ``--config`` and one string flag per knob on `values` (those not there yet)."""
    if "config" not in values:
        flags.DEFINE_string("config", None, "YAML file with tfsyncmodes knobs (see configs/).",
                            flag_values=values)
    for knob in KNOBS:
        if knob.flag not in values:
            # Strings, so that resolve() validates every source with one parser and one message.
            flags.DEFINE_string(knob.flag, str(knob.default), _help(knob), flag_values=values)
    return values


def parse_known(argv: Sequence[str]) -> flags.FlagValues:
    """tfsyncmodes' flags from `argv` (program name first), every other argument left alone."""
    values = define(flags.FlagValues())
    values(list(argv), known_only=True)
    return values


define(flags.FLAGS)
