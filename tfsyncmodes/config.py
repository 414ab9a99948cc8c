"""One resolved, validated, immutable configuration per run.

Sources, in rising precedence: built-in defaults (a mode's own where
:attr:`~tfsyncmodes.knob_types.Knob.mode_defaults` says so) < a YAML config file (``--sync_config``
or ``TFSYNC_CONFIG``) < environment variables (``TFSYNC_<KEY>``) < absl flags given on the
command line (``--sync_<key>``) < arguments in code. Every value, from every source, goes
through its knob's one parser. The result remembers which source every value came from, so the
chief can log it (:meth:`SyncConfig.describe`); a knob given explicitly that has no effect in
the resolved configuration (``topk_ratio`` without ``compression=topk``) is one warning line.

Every knob is declared once in :data:`tfsyncmodes.knobs.KNOBS`; the flags
(``tfsyncmodes.flags``), the environment variables, the accepted config-file keys and the
validation all derive from it.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from absl import logging

from tfsyncmodes import flags as flag_defs
from tfsyncmodes.errors import ConfigError, one_of
from tfsyncmodes.knobs import ENV_PREFIX, KNOBS, KNOBS_BY_KEY, Knob, in_force, run_modes

CONFIG_ENV = flag_defs.CONFIG_ENV
_warned = set()  # warning lines logged already (a run resolves more than once)


def _knobs_in_force(self) -> Tuple[str, ...]:
    """The keys of the knobs that act in this configuration (in any mode it trains in)."""
    values = knob_values(self)
    return tuple(knob.key for knob in KNOBS if in_force(knob, values))


def _describe(self, every: bool = False) -> str:
    """One line per knob in force (`every`: every knob): its value and where it came from."""
    width = max(len(k.key) for k in KNOBS)
    shown = {k.key for k in KNOBS} if every else set(self.knobs_in_force())
    what = "every knob" if every else "the knobs in force for mode " + "/".join(run_modes(knob_values(self)))
    lines = [f"tfsyncmodes configuration ({what}):"]
    for knob in KNOBS:
        if knob.key in shown:
            value = getattr(self, knob.key)
            lines.append(f"  {knob.key:<{width}} = {value!r:<12} ({self.sources.get(knob.key, 'default')})")
    return "\n".join(lines)


# The resolved configuration: one immutable field per knob, plus where each value came from.
# Built from KNOBS so that a knob is declared in one place only. Use resolve() to make one.
SyncConfig = dataclasses.make_dataclass(
    "SyncConfig",
    [(k.key, Any, dataclasses.field(default=k.default)) for k in KNOBS]
    + [("sources", Mapping, dataclasses.field(default_factory=dict, compare=False))],
    frozen=True,
    namespace={"describe": _describe, "knobs_in_force": _knobs_in_force, "__module__": __name__,
               "__doc__": "The resolved, immutable configuration of a run (see resolve())."},
)
"""The resolved, immutable configuration of a run (made by :func:`resolve`; a strategy's
``config``): one field per knob of :data:`tfsyncmodes.knobs.KNOBS`, by its key (``mode``,
``period``, ...), and ``sources``, where each value came from (``default``, ``config file
PATH``, ``environment``, ``flag``, ``argument``). ``describe(every=False)``: one line per knob in
force (every knob with ``every=True``), its value and source; ``knobs_in_force()``: their keys."""


def field_of(knob: Knob, source: str) -> str:
    """How a ConfigError names `knob` given by `source`: its flag, its variable, or its key."""
    return {"environment": knob.env, "flag": "--" + knob.flag}.get(source, knob.key)


def given_as(config: "SyncConfig", key: str) -> Tuple[str, str]:
    """(source, field) of knob `key`'s value in `config`, as a ConfigError names them: e.g.
    ("flag", "--sync_mode"), ("environment", "TFSYNC_MODE"), ("argument", "mode")."""
    source = config.sources.get(key, "default")
    return source, field_of(KNOBS_BY_KEY[key], source)


def _parse(knob: Knob, value: Any, source: str, field: str) -> Any:
    try:
        return knob.parse(value)
    except ValueError as error:
        problem, fix = error.args if len(error.args) == 2 else (str(error), None)
        raise ConfigError(source, field, problem, fix) from None


def knob_values(config: "SyncConfig") -> Dict[str, Any]:
    """Every knob's value, as a model saves the knobs its exchange was built with."""
    return {knob.key: getattr(config, knob.key) for knob in KNOBS}


# Values an optimizer saved before the knobs took words: the number that meant the word.
_SAVED_SENTINELS = {"clip_norm": (0, "off"), "lr_decay": (0, "off"), "delay_compensation": (0, "off"),
                    "max_staleness": (-1, "off"), "group_size": (0, "host"), "outer_lr": (0, "auto"),
                    "elastic_alpha": (0, "auto")}


def _saved_before_period(values: Mapping[str, Any]) -> Dict[str, Any]:
    """Knobs saved before ``period`` existed, in today's terms: sentinels as words, and the
    period that staleness (+1) or a numeric local_steps set."""
    out = dict(values)
    for key, (old, word) in _SAVED_SENTINELS.items():
        if key in out and not isinstance(out[key], (str, bool)) and out[key] == old:
            out[key] = word
    steps = out.get("local_steps", 0)
    out["period"] = steps if isinstance(steps, int) and steps > 0 else int(out.get("staleness", 7)) + 1
    out["local_steps"] = "auto" if steps == "auto" else "fixed"
    return out


def from_saved(values: Mapping[str, Any], source: str = "saved optimizer") -> "SyncConfig":
    """The config a saved optimizer was built with (knobs it does not name: defaults)."""
    if "period" not in values and "staleness" in values:
        values = _saved_before_period(values)
    parsed = {key: _parse(KNOBS_BY_KEY[key], value, source, key)
              for key, value in values.items() if key in KNOBS_BY_KEY}
    return SyncConfig(**parsed, sources={key: source for key in parsed})


def load_file(path: str, source: str = "flag", field: str = "--" + flag_defs.CONFIG_FLAG) -> Dict[str, Any]:
    """Reads a YAML config file (named by `source`'s `field`): knob keys or flag names to values."""
    import yaml

    where = f"config file {path}"
    if not os.path.isfile(path):
        what = "is a directory, not a file" if os.path.isdir(path) else "does not exist"
        raise ConfigError(source, field, f"{path} {what}", "give an existing YAML file, e.g. configs/sync.yaml")
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except UnicodeDecodeError as error:
        raise ConfigError(where, "(yaml)", f"is not UTF-8 text (byte {error.start})",
                          "save it as UTF-8 (YAML's own encoding)") from None
    except OSError as error:
        raise ConfigError(source, field, f"{path} cannot be read: {error.strerror}",
                          "give a YAML file this process can read") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(where, "(yaml)", f"does not parse{at}: {getattr(error, 'problem', error)}",
                          "fix the YAML syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(where, "(yaml)", "must be a mapping of knob: value", one_of(KNOBS_BY_KEY))
    by_flag = {knob.flag: knob.key for knob in KNOBS}
    unknown = [str(key) for key in data if key not in KNOBS_BY_KEY and key not in by_flag]
    if unknown:
        raise ConfigError(where, ", ".join(unknown), f"unknown key{'s' if len(unknown) > 1 else ''}",
                          "use knob names or their flag names: " + ", ".join(KNOBS_BY_KEY))
    twice = [key for key in data if key in by_flag and by_flag[key] in data]
    if twice:
        raise ConfigError(where, f"{by_flag[twice[0]]}, {twice[0]}", "name the same knob", "keep one of them")
    return {by_flag.get(key, key): value for key, value in data.items()}


def with_mode_defaults(config: "SyncConfig", mode: str) -> "SyncConfig":
    """`config` as a run in `mode` has it: ``mode`` set, and knobs at their default take that
    mode's default (:attr:`~tfsyncmodes.knob_types.Knob.mode_defaults`)."""
    values = {knob.key: knob.default_for(mode) for knob in KNOBS
              if knob.key != "mode" and config.sources.get(knob.key, "default") == "default"}
    return dataclasses.replace(config, mode=mode, **values)


def _warn_not_in_force(config: "SyncConfig") -> None:
    """One warning line per knob given explicitly that has no effect in `config`."""
    values, shown = knob_values(config), set(config.knobs_in_force())
    for knob in KNOBS:
        source = config.sources.get(knob.key, "default")
        if source == "default" or knob.key in shown:
            continue
        context = ", ".join(f"mode_schedule={values['mode_schedule']}" if key == "mode" and values["mode_schedule"]
                            else f"{key}={values[key]!r}" if values[key] == "" else f"{key}={values[key]}"
                            for key in knob.applies.deciding)
        line = (f"tfsyncmodes: {field_of(knob, source)} ({source}) has no effect: it applies with "
                f"{knob.applies.depends}, and this run has {context}")
        if line not in _warned:
            _warned.add(line)
            logging.warning("%s", line)


def _warn_misspelled(environ: Mapping[str, str]) -> None:
    """One warning line per ``TFSYNC_`` variable that is no knob's but close to one's name (a
    typo would otherwise be ignored without a word; the package's other variables, such as
    its install's, are not close to a knob's and pass)."""
    names = [knob.env for knob in KNOBS] + [CONFIG_ENV]
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in names:
            continue
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
        if not close:
            continue
        line = (f"tfsyncmodes: environment variable {name} is not one of the knobs' and is ignored; "
                f"did you mean {close[0]}?")
        if line not in _warned:
            _warned.add(line)
            logging.warning("%s", line)


def resolve(
    overrides: Optional[Mapping[str, Any]] = None,
    environ: Mapping[str, str] = os.environ,
    use_flags: bool = True,
) -> SyncConfig:
    """Builds the run's configuration from every source, highest precedence last.

    `overrides` are arguments given in code (e.g. ``make_strategy("async")``) and rank with
    the flags, above the environment.
    """
    flag_values = flag_defs.command_line() if use_flags else {}
    overrides = dict(overrides or {})
    for key in overrides:
        if key not in KNOBS_BY_KEY:
            raise ConfigError("argument", key, "unknown knob", one_of(KNOBS_BY_KEY))

    layers = [("default", {k.key: k.default for k in KNOBS})]
    if flag_values.get("config"):
        layers.append((f"config file {flag_values['config']}", load_file(flag_values["config"])))
    elif environ.get(CONFIG_ENV):
        layers.append((f"config file {environ[CONFIG_ENV]}",
                       load_file(environ[CONFIG_ENV], "environment", CONFIG_ENV)))
    flag_values.pop("config", None)
    layers.append(("environment", {k.key: environ[k.env] for k in KNOBS if environ.get(k.env, "") != ""}))
    _warn_misspelled(environ)
    layers.append(("flag", flag_values))
    layers.append(("argument", {k: v for k, v in overrides.items() if v is not None}))

    values: Dict[str, Any] = {}
    sources: Dict[str, str] = {}
    for source, layer in layers:
        for key, value in layer.items():
            knob = KNOBS_BY_KEY[key]
            values[key] = _parse(knob, value, source, field_of(knob, source))
            sources[key] = source
    config = with_mode_defaults(SyncConfig(**values, sources=sources), values["mode"])
    _warn_not_in_force(config)
    return config
