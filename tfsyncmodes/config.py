"""One resolved, validated, immutable configuration per run.

Sources, in rising precedence: built-in defaults < a YAML config file (``--config`` or
``TFSYNC_CONFIG``) < environment variables (``TFSYNC_<KNOB>``) < absl flags that were given on
the command line. The result remembers which source every value came from, so the chief can
log it (:meth:`SyncConfig.describe`).

Every knob is declared once in :data:`KNOBS`; the flags (``tfsyncmodes.flags``), the
environment variables, the accepted config-file keys and the validation all derive from it.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from tfsyncmodes import registry
from tfsyncmodes.errors import ConfigError, one_of

ENV_PREFIX = "TFSYNC_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"


@dataclasses.dataclass(frozen=True)
class Knob:
    """A configuration value: its name in a config file, its flag, its parser and its help."""

    key: str
    flag: str
    default: Any
    parse: Callable[[Any], Any]
    help: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()


def _choice(choices: Callable[[], Tuple[str, ...]]) -> Callable[[Any], str]:
    """A parser accepting the names `choices()` gives (read at parse time, from a registry)."""
    def parse(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices():
            raise ValueError(f"{value!r} is not accepted", one_of(choices()))
        return text
    parse.choices = choices
    return parse


def _registered(reg: registry.Registry, *extra: str) -> Callable[[Any], str]:
    return _choice(lambda: extra + reg.names())


def _number(kind: type, low: float, high: float) -> Callable[[Any], Any]:
    def parse(value: Any) -> Any:
        try:
            number = kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"{value!r} is not a {kind.__name__}", f"use a {kind.__name__} in [{low}, {high}]")
        if not low <= number <= high:
            raise ValueError(f"{number} is out of range", f"use a {kind.__name__} in [{low}, {high}]")
        return number
    return parse


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a boolean", "use true or false")


def _rank_groups(value: Any) -> str:
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


def _slow_worker(value: Any) -> str:
    text = str(value).strip()
    if not text:
        return ""
    fix = "use INDEX:FACTOR with INDEX >= 0 and FACTOR >= 1, e.g. 1:4.0"
    index, _, factor = text.partition(":")
    try:
        if int(index) < 0 or float(factor) < 1.0:
            raise ValueError
    except ValueError:
        raise ValueError(f"{value!r} is not accepted", fix) from None
    return f"{int(index)}:{float(factor)}"


KNOBS: Tuple[Knob, ...] = (
    Knob("mode", "sync_mode", "sync", _registered(registry.MODES),
         "How replicas keep in step: sync (allreduce every step), async (parameter servers), "
         "hybrid (sync inside groups, compressed and bounded-stale across them)."),
    Knob("backend", "sync_backend", "auto", _registered(registry.BACKENDS, "auto"),
         "Engine for sync mode. auto: horovod under horovodrun, multi_worker with a TF_CONFIG "
         "of several workers, mirrored otherwise."),
    Knob("collective_timeout", "sync_collective_timeout", 300.0, _number(float, 1.0, 86400.0),
         "Seconds a collective operation may wait for peers before the run fails instead of "
         "hanging."),
    Knob("slow_worker", "slow_worker", "", _slow_worker,
         "Fault injection for benchmarks: 'INDEX:FACTOR' makes worker INDEX take FACTOR times "
         "as long per step (e.g. 1:4.0). Empty: off."),
    # --- async knobs ---
    Knob("ps_shards", "ps_shards", 1, _number(int, 1, 1024),
         "Async: split each large variable over up to this many ps tasks (1: no sharding)."),
    Knob("min_shard_bytes", "min_shard_bytes", 256 << 10, _number(int, 1, 1 << 40),
         "Async: a variable shard holds at least this many bytes."),
    Knob("clip_norm", "clip_norm", 0.0, _number(float, 0.0, 1e9),
         "Async: clip each update's gradients to this global norm (0: off)."),
    Knob("staleness_aware_lr", "staleness_aware_lr", True, _boolean,
         "Async: scale each update by 1/(1+staleness), staleness = updates that landed "
         "between the worker's read and its write. Hybrid with cross_group=stale: scale each "
         "of the other groups' updates by 1/(1+steps it is applied late)."),
    Knob("lr_decay", "lr_decay", 0.0, _number(float, 0.0, 1e3),
         "Async: scale update n by 1/(1 + lr_decay * n) (inverse-time decay; 0: off)."),
    Knob("momentum", "momentum", 0.9, _number(float, 0.0, 0.999),
         "Async: momentum of the SGD optimizer scripts/train.py uses in async mode."),
    # --- hybrid knobs ---
    Knob("group_size", "group_size", 0, _number(int, 0, 1 << 20),
         "Hybrid: ranks 0..S-1 form group 0, S..2S-1 group 1, ... (0: one group per host)."),
    Knob("groups", "groups", "", _rank_groups,
         "Hybrid: explicit groups of Horovod ranks, e.g. '0,1;2,3' (overrides group_size)."),
    Knob("compression", "compression", "topk", _registered(registry.COMPRESSORS),
         "Hybrid: how updates travel across groups: none (float32), fp16 (half the bytes), "
         "topk (the topk_ratio largest entries as values + int32 indices)."),
    Knob("topk_ratio", "topk_ratio", 0.01, _number(float, 1e-6, 1.0),
         "Hybrid: fraction of entries compression=topk sends each step."),
    Knob("error_feedback", "error_feedback", True, _boolean,
         "Hybrid: add what compression dropped back into the next step's update."),
    Knob("staleness", "staleness", 2, _number(int, 0, 1000),
         "Hybrid: a group may run at most this many steps ahead of the slowest group "
         "(0: groups stay in lockstep)."),
    Knob("cross_group", "cross_group", "periodic", _registered(registry.CROSS_GROUP),
         "Hybrid: periodic (local SGD: groups average their model changes every "
         "staleness+1 steps, and their models at the end) or stale (a background exchange "
         "every step, applied as soon as it is in and at most staleness steps late)."),
    Knob("warmup_steps", "warmup_steps", 0, _number(int, 0, 1 << 30),
         "Hybrid: the first this many steps run in lockstep (staleness 0) before the "
         "staleness bound applies."),
)
KNOBS_BY_KEY: Mapping[str, Knob] = {knob.key: knob for knob in KNOBS}


def _describe(self) -> str:
    """One line per knob: value and the source it came from."""
    width = max(len(k.key) for k in KNOBS)
    lines = ["tfsyncmodes configuration:"]
    for knob in KNOBS:
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
    return SyncConfig(**values, sources=sources)
