"""One error type for bad input, and the entry-point guard that prints it as one line.

Every bad value a user can give (a flag, an environment variable, a config file, TF_CONFIG,
Horovod's environment) raises :class:`ConfigError` naming where the value came from, which
field it is, and what would be accepted. Scripts run their ``main`` through :func:`run`, which
turns the error into a single message on stderr and exit status 2 instead of a traceback.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Callable, Iterable, Optional

EXIT_CONFIG_ERROR = 2
EXIT_JOB_FAILURE = 3


class ConfigError(ValueError):
    """A user-supplied value is invalid. The message says where, what and how to fix it."""

    def __init__(self, source: str, field: str, problem: str, fix: Optional[str] = None):
        self.source = source
        self.field = field
        self.problem = problem
        self.fix = fix
        message = f"{source}: {field}: {problem}"
        if fix:
            message += f"; {fix}"
        super().__init__(message)


def one_of(values: Iterable[object]) -> str:
    """The `fix` text for a value restricted to a set of choices."""
    return "use one of: " + ", ".join(str(v) for v in values)


def run(main: Callable[[list], object]) -> None:
    """``absl.app.run(main)`` that reports :class:`ConfigError` (exit 2) and
    :class:`JobFailure` (exit 3) as one line each instead of a traceback."""
    from absl import app

    def guarded(argv):
        try:
            return main(argv)
        except ConfigError as error:
            print(f"tfsyncmodes: error: {error}", file=sys.stderr, flush=True)
            sys.exit(EXIT_CONFIG_ERROR)
        except JobFailure as error:
            print(f"tfsyncmodes: error: {error}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            # TensorFlow's teardown of a broken cluster logs a page of gRPC errors; skip it.
            os._exit(EXIT_JOB_FAILURE)

    def parse_flags(argv):
        # absl's own parser prints the usage and exits 1; a bad flag is bad input like any other.
        from absl import flags

        try:
            return flags.FLAGS(argv)
        except flags.Error as error:
            if isinstance(error.__context__, ConfigError):  # a knob's flag: its parser's message
                print(f"tfsyncmodes: error: {error.__context__}", file=sys.stderr, flush=True)
            else:
                print(f"tfsyncmodes: error: flag: {error}; see --helpfull", file=sys.stderr, flush=True)
            sys.exit(EXIT_CONFIG_ERROR)

    app.run(guarded, flags_parser=parse_flags)


def at_least(value, low, source: str, field: str, fix: Optional[str] = None) -> None:
    """ConfigError unless `value` is a finite number >= `low` (None: not given, nothing to
    check); nan and infinity are refused, as no training can use them."""
    if value is not None and not math.isfinite(value):
        raise ConfigError(source, field, f"{value} is not a finite number", fix or f"use a value >= {low}")
    if value is not None and value < low:
        raise ConfigError(source, field, f"{value} is too small", fix or f"use a value >= {low}")


class JobFailure(RuntimeError):
    """A distributed job cannot go on (a lost parameter server, ...). The message says what
    was lost and how to resume."""
