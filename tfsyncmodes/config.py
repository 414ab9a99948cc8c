"""One resolved, validated, immutable configuration per run.

Sources, in rising precedence: built-in defaults < a YAML config file (``--config`` or
``TFSYNC_CONFIG``) < environment variables (``TFSYNC_<KNOB>``) < absl flags that were given on
the command line. The result remembers which source every value came from, so the chief can
log it (:meth:`SyncConfig.describe`).

Every knob is declared once in :data:`tfsyncmodes.knobs.KNOBS`; the flags
(``tfsyncmodes.flags``), the environment variables, the accepted config-file keys and the
validation all derive from it.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Mapping, Optional

from tfsyncmodes.errors import ConfigError, one_of
from tfsyncmodes.knobs import ENV_PREFIX, KNOBS, KNOBS_BY_KEY, Knob

CONFIG_ENV = ENV_PREFIX + "CONFIG"


def _describe(self, every: bool = False) -> str:
    """One line per knob the run's mode uses (`every`: every knob): value and its source."""
    width = max(len(k.key) for k in KNOBS)
    lines = [f"tfsyncmodes configuration ({'every knob' if every else 'the knobs ' + self.mode + ' mode uses'}):"]
    for knob in KNOBS:
        if not (every or knob.used_by(self.mode)):
            continue
        value = getattr(self, knob.key)
        lines.append(f"  {knob.key:<{width}} = {value!r:<12} ({self.sources.get(knob.key, 'default')})")
    return "\n".join(lines)


# The resolved configuration: one immutable field per knob, plus where each value came from.
# Built from KNOBS so that a knob is declared in one place only. Use resolve() to make one.
SyncConfig = dataclasses.make_dataclass(
    "SyncConfig",
    [(k.key, type(k.default), dataclasses.field(default=k.default)) for k in KNOBS]
    + [("sources", Mapping, dataclasses.field(default_factory=dict, compare=False))],
    frozen=True,
    namespace={"describe": _describe, "__module__": __name__,
               "__doc__": "The resolved, immutable configuration of a run (see resolve())."},
)

def _parse(knob: Knob, value: Any, source: str, field: str) -> Any:
    try:
        return knob.parse(value)
    except ValueError as error:
        problem, fix = error.args if len(error.args) == 2 else (str(error), None)
        raise ConfigError(source, field, problem, fix) from None


def knob_values(config: "SyncConfig") -> Dict[str, Any]:
    """Every knob's value, as a model saves the knobs its exchange was built with."""
    return {knob.key: getattr(config, knob.key) for knob in KNOBS}


def from_saved(values: Mapping[str, Any], source: str = "saved optimizer") -> "SyncConfig":
    """The config a saved optimizer was built with (knobs it does not name: defaults)."""
    parsed = {key: _parse(KNOBS_BY_KEY[key], value, source, key)
              for key, value in values.items() if key in KNOBS_BY_KEY}
    return SyncConfig(**parsed, sources={key: source for key in parsed})


def load_file(path: str) -> Dict[str, Any]:
    """Reads a YAML config file: a mapping of knob keys to values."""
    import yaml

    source = f"config file {path}"
    if not os.path.isfile(path):
        raise ConfigError("--config", "path", f"{path} does not exist",
                          "give an existing YAML file, e.g. configs/sync.yaml")
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(source, "(yaml)", f"does not parse{where}: {getattr(error, 'problem', error)}",
                          "fix the YAML syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(source, "(yaml)", "must be a mapping of knob: value", one_of(KNOBS_BY_KEY))
    by_flag = {knob.flag: knob.key for knob in KNOBS}
    unknown = [str(key) for key in data if key not in KNOBS_BY_KEY and key not in by_flag]
    if unknown:
        raise ConfigError(source, ", ".join(unknown), f"unknown key{'s' if len(unknown) > 1 else ''}",
                          "use knob names or their flag names: " + ", ".join(KNOBS_BY_KEY))
    return {by_flag.get(key, key): value for key, value in data.items()}


def _flag_values() -> Dict[str, Any]:
    """Knob values given explicitly on the command line.

    From absl's FLAGS when the program parsed them (``absl.app.run``, ``tfsyncmodes.run``);
    otherwise (an argparse script, or none) absl parses this program's ``sys.argv`` into a
    private set of just tfsyncmodes' flags, leaving every other argument to the script, so
    that ``--sync_mode`` and the other knobs are never silently ignored.
    """
    import sys

    from absl import flags

    from tfsyncmodes import flags as flag_defs

    values = flags.FLAGS
    if not values.is_parsed():
        values = flag_defs.parse_known(sys.argv)
    given = {}
    for knob in KNOBS:
        if knob.flag in values and values[knob.flag].present:
            given[knob.key] = values[knob.flag].value
    if "config" in values and values["config"].present:
        given["config"] = values["config"].value
    return given


def resolve(
    overrides: Optional[Mapping[str, Any]] = None,
    environ: Mapping[str, str] = os.environ,
    use_flags: bool = True,
) -> SyncConfig:
    """Builds the run's configuration from every source, highest precedence last.

    `overrides` are arguments given in code (e.g. ``make_strategy("async")``) and rank with
    the flags, above the environment.
    """
    flag_values = _flag_values() if use_flags else {}
    overrides = dict(overrides or {})
    for key in overrides:
        if key not in KNOBS_BY_KEY:
            raise ConfigError("argument", key, "unknown knob", one_of(KNOBS_BY_KEY))

    config_path = flag_values.pop("config", None) or environ.get(CONFIG_ENV) or None
    layers = [("default", {k.key: k.default for k in KNOBS})]
    if config_path:
        layers.append((f"config file {config_path}", load_file(config_path)))
    layers.append(("environment", {k.key: environ[k.env] for k in KNOBS if environ.get(k.env, "") != ""}))
    layers.append(("flag", flag_values))
    layers.append(("argument", {k: v for k, v in overrides.items() if v is not None}))

    values: Dict[str, Any] = {}
    sources: Dict[str, str] = {}
    for source, layer in layers:
        for key, value in layer.items():
            knob = KNOBS_BY_KEY[key]
            field = {"environment": knob.env, "flag": "--" + knob.flag}.get(source, key)
            values[key] = _parse(knob, value, source, field)
            sources[key] = source
    for knob in KNOBS:  # a default that depends on the mode (compression: topk in hybrid)
        if sources[knob.key] == "default":
            values[knob.key] = knob.default_for(values["mode"])
    return SyncConfig(**values, sources=sources)
