"""Every knob of tfsyncmodes, declared once: its config-file key, flag, default, parser, help
and the modes that use it. The flags (``tfsyncmodes.flags``), the environment variables, the
accepted config-file keys, the validation and the configuration listing all derive from
:data:`KNOBS`; values a registry accepts (modes, backends, compressors, policies) are read from
:mod:`tfsyncmodes.registry` when they are parsed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Tuple

from tfsyncmodes import registry
from tfsyncmodes.errors import one_of

ENV_PREFIX = "TFSYNC_"
ALL_MODES = ()  # a knob every mode uses


@dataclasses.dataclass(frozen=True)
class Knob:
    """A configuration value: its name in a config file, its flag, its parser and its help."""

    key: str
    flag: str
    default: Any
    parse: Callable[[Any], Any]
    help: str
    modes: Tuple[str, ...] = ALL_MODES  # the modes that use it (listed for them only)
    mode_defaults: Tuple[Tuple[str, Any], ...] = ()  # (mode, default) where a mode's differs

    def default_for(self, mode: str) -> Any:
        return dict(self.mode_defaults).get(mode, self.default)

    def used_by(self, mode: str) -> bool:
        return not self.modes or mode in self.modes

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


def _schedule(value: Any) -> str:
    from tfsyncmodes import schedule  # registry-only import, no TensorFlow

    return schedule.parse(value)


def _local_steps(value: Any) -> Any:
    """'auto' or a number of inner steps per round >= 0 (0: staleness + 1)."""
    if str(value).strip().lower() == "auto":
        return "auto"
    try:
        number = int(str(value).strip())
        if number < 0 or number > 1 << 20:
            raise ValueError
    except ValueError:
        raise ValueError(f"{value!r} is not accepted",
                         "use auto or a number of steps in [0, 1048576] (0: staleness + 1)") from None
    return number


def _slow_worker(value: Any) -> str:
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


KNOBS: Tuple[Knob, ...] = (
    Knob("mode", "sync_mode", "sync", _registered(registry.MODES),
         "How replicas keep in step: sync (allreduce every step), async (parameter servers), "
         "hybrid (sync inside groups, compressed and bounded-stale across them)."),
    Knob("backend", "sync_backend", "auto", _registered(registry.BACKENDS, "auto"),
         "Engine for sync mode. auto: horovod under horovodrun, multi_worker with a TF_CONFIG "
         "of several workers, mirrored otherwise.",
         modes=("sync",)),
    Knob("mode_schedule", "mode_schedule", "", _schedule,
         "Run through several modes, e.g. 'sync:10%,hybrid:80%,sync' or 'sync:2e,async': phases "
         "of MODE:LENGTH, LENGTH a percentage of the steps, epochs (2e) or steps; the last phase "
         "may omit it. Empty: the whole run in sync_mode."),
    Knob("collective_timeout", "sync_collective_timeout", 300.0, _number(float, 1.0, 86400.0),
         "Seconds a collective operation may wait for peers before the run fails instead of "
         "hanging."),
    Knob("slow_worker", "slow_worker", "", _slow_worker,
         "Fault injection for benchmarks: 'INDEX:FACTOR' makes worker INDEX take FACTOR times "
         "as long per step (e.g. 1:4.0); 'INDEX:FACTOR@START%-END%' only while the step is in "
         "that part of the run (e.g. 1:4.0@30%-60%; sync and hybrid). Empty: off."),
    # --- async knobs ---
    Knob("ps_shards", "ps_shards", 1, _number(int, 1, 1024),
         "Async: split each large variable over up to this many ps tasks (1: no sharding).",
         modes=("async",)),
    Knob("min_shard_bytes", "min_shard_bytes", 256 << 10, _number(int, 1, 1 << 40),
         "Async: a variable shard holds at least this many bytes.",
         modes=("async",)),
    Knob("clip_norm", "clip_norm", 0.0, _number(float, 0.0, 1e9),
         "Async: clip each update's gradients to this global norm (0: off).",
         modes=("async",)),
    Knob("staleness_aware_lr", "staleness_aware_lr", True, _boolean,
         "Async: scale each update by 1/(1+staleness), staleness = updates that landed "
         "between the worker's read and its write. Hybrid with cross_group=stale: scale each "
         "of the other groups' updates by 1/(1+steps it is applied late).",
         modes=("async", "hybrid")),
    Knob("lr_decay", "lr_decay", 0.0, _number(float, 0.0, 1e3),
         "Async: scale update n by 1/(1 + lr_decay * n) (inverse-time decay; 0: off).",
         modes=("async",)),
    Knob("momentum", "momentum", 0.9, _number(float, 0.0, 0.999),
         "Async: momentum of the SGD optimizer scripts/train.py uses in async mode.",
         modes=("async",)),
    Knob("max_staleness", "max_staleness", -1, _number(int, -1, 1 << 30),
         "Async: drop (scale to zero) an update staler than this many updates, as the SSP "
         "bound; the count is logged as dropped_updates (-1: off; 0: keep only fresh updates).",
         modes=("async",)),
    Knob("delay_compensation", "delay_compensation", 0.0, _number(float, 0.0, 1e3),
         "Async: DC-ASGD, correct each gradient g computed on weights w_read and applied to "
         "w_now with g + LAMBDA * g * g * (w_now - w_read) (0: off; the paper uses 0.04).",
         modes=("async",)),
    # --- hybrid knobs ---
    Knob("group_size", "group_size", 0, _number(int, 0, 1 << 20),
         "Hybrid: ranks 0..S-1 form group 0, S..2S-1 group 1, ... (0: one group per host).",
         modes=("hybrid",)),
    Knob("groups", "groups", "", _rank_groups,
         "Hybrid: explicit groups of Horovod ranks, e.g. '0,1;2,3' (overrides group_size).",
         modes=("hybrid",)),
    Knob("compression", "compression", "none", _registered(registry.COMPRESSORS),
         "Sync (under Horovod): how gradients travel in the allreduce; hybrid: how updates "
         "travel across groups. none (float32), fp16 (half the bytes), topk (the topk_ratio "
         "largest entries as values + int32 indices, with error feedback). Default: none (in "
         "hybrid mode a dense average every staleness+1 steps came closest to the straggler "
         "targets; Top-K 1 % missed them by far).",
         modes=("sync", "hybrid")),
    Knob("topk_ratio", "topk_ratio", 0.01, _number(float, 1e-6, 1.0),
         "Sync and hybrid: fraction of entries compression=topk sends each step.",
         modes=("sync", "hybrid")),
    Knob("error_feedback", "error_feedback", True, _boolean,
         "Sync and hybrid: add what compression dropped back into the next step's update.",
         modes=("sync", "hybrid")),
    Knob("staleness", "staleness", 2, _number(int, 0, 1000),
         "Hybrid: a group may run at most this many steps ahead of the slowest group "
         "(0: groups stay in lockstep); with local_steps=auto, the fastest group's inner steps "
         "per round minus 1. Hybrid's shipped default: 7.",
         modes=("hybrid",), mode_defaults=(("hybrid", 7),)),
    Knob("cross_group", "cross_group", "periodic", _registered(registry.CROSS_GROUP),
         "Hybrid: periodic (local SGD: groups average their model changes every "
         "staleness+1 steps, and their models at the end) or stale (a background exchange "
         "every step, applied as soon as it is in and at most staleness steps late). "
         "elastic: EASGD, groups and a center copy of the model pull toward each other every "
         "staleness+1 steps (elastic_alpha); the final model is the center.",
         modes=("hybrid",)),
    Knob("outer_optimizer", "outer_optimizer", "average", _registered(registry.OUTER_OPTIMIZERS),
         "Hybrid, cross_group=periodic: how the groups' mean change is applied at each average: "
         "average (anchor + outer_lr * mean change) or nesterov (SGD with Nesterov momentum on the "
         "pseudo-gradient, as DiLoCo).",
         modes=("hybrid",)),
    Knob("outer_lr", "outer_lr", 0.0, _number(float, 0.0, 10.0),
         "Hybrid: the outer optimizer's learning rate (0: its default, 1.0 for average, 0.7 for "
         "nesterov).",
         modes=("hybrid",)),
    Knob("outer_momentum", "outer_momentum", 0.9, _number(float, 0.0, 0.999),
         "Hybrid: the nesterov outer optimizer's momentum.",
         modes=("hybrid",)),
    Knob("warmup_steps", "warmup_steps", 0, _number(int, 0, 1 << 30),
         "Hybrid: the first this many steps run in lockstep (staleness 0) before the "
         "staleness bound applies.",
         modes=("hybrid",)),
    Knob("elastic_alpha", "elastic_alpha", 0.0, _number(float, 0.0, 1.0),
         "Hybrid, cross_group=elastic: the elastic coefficient alpha; the center moves "
         "alpha * (sum of the groups' differences to it), then each group moves groups * alpha of "
         "the way to the new center (0: the EASGD paper's 0.9 / groups; 1 / groups is periodic "
         "averaging; groups * alpha must be <= 1).",
         modes=("hybrid",)),
    # --- online switching (tfsyncmodes/switching/) ---
    Knob("switch_policy", "switch_policy", "none", _choice(lambda: ("none", "straggler")),
         "Under horovodrun: straggler moves a sync run to hybrid, the slow ranks in one group, "
         "while the slowest rank's step time over the median stays at or above "
         "switch_threshold, and back to sync once it falls (none: stay in one mode)."),
    Knob("switch_threshold", "switch_threshold", 1.5, _number(float, 1.01, 1e3),
         "switch_policy=straggler: the slowest/median step-time ratio that counts as a "
         "straggler (back to sync below 1 + (threshold - 1) / 2)."),
    Knob("switch_interval", "switch_interval", 10, _number(int, 2, 1 << 20),
         "switch_policy=straggler: every this many steps the ranks exchange their mean step "
         "time and decide."),
    Knob("switch_patience", "switch_patience", 2, _number(int, 1, 1000),
         "switch_policy=straggler: consecutive windows above (or below) the threshold before "
         "a switch (hysteresis)."),
    Knob("local_steps", "local_steps", 0, _local_steps,
         "Hybrid, cross_group=periodic: inner steps each group runs between averages. A number "
         "(0: staleness+1), or auto: each group as many as its measured speed allows, the "
         "fastest staleness+1, and the average weights groups by the samples they processed "
         "(Async Local-SGD's dynamic local updates).",
         modes=("hybrid",)),
)
KNOBS_BY_KEY: Mapping[str, Knob] = {knob.key: knob for knob in KNOBS}
