"""A bed row as the cost model prices it (:mod:`benchmarks.bed_model` compares and fits): the
bed's JSON read and checked, its ``costs.Job`` as the bed ran it, and the predicted steady rate
of a mode under a condition, closed form or simulated (:mod:`tfsyncmodes.simulate`: hybrid's
rounds under a transient straggler or a heavy tail, the straggler policy step by step). The rules are
:mod:`benchmarks.bed_model`'s module doc."""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Optional

import numpy as np

from benchmarks import bed_calibration as cal
from benchmarks.benchlib import flag_value
from tfsyncmodes import costs, knobs, simulate, simulate_policy

@dataclasses.dataclass(frozen=True)
class Settings:
    """The flags, for callers that do not parse them."""

    tolerance: float = 0.15
    fixed_alpha_us: float = 50.0
    loopback_gbit: float = 10.0
    batch_size: int = 64
    replay_draws: bool = True
    holdout: tuple = ()  # names of bed files whose rows fit nothing (validation only)


DEFAULT = Settings()

class BadInput(Exception):
    """Input the model cannot price: one line for the user."""


def load(path: str) -> dict:
    """A bed JSON, checked for what the model reads."""
    try:
        with open(path, encoding="utf-8") as handle:
            bed = json.load(handle)
    except OSError as error:
        raise BadInput(f"{path}: cannot be read ({error.strerror}); give a bed JSON such as docs/bed_4r_1gbit.json")
    except ValueError as error:
        raise BadInput(f"{path}: is not JSON ({error}); give a bed JSON written by benchmarks.bed")
    if not isinstance(bed, dict) or not isinstance(bed.get("rows"), list) or not bed["rows"]:
        raise BadInput(f"{path}: has no rows; give a bed JSON written by benchmarks.bed")
    for key in ("ranks", "hosts", "link", "measured_mbit_s", "emulated_step_ms", "epochs"):
        if key not in bed:
            raise BadInput(f"{path}: has no {key!r}; give a bed JSON written by benchmarks.bed")
    hosts = bed["hosts"]
    if len(set(hosts)) != 1 or sum(hosts) != bed["ranks"]:
        raise BadInput(f"{path}: hosts {hosts} are not equal groups of {bed['ranks']} ranks")
    for row in bed["rows"]:
        if not isinstance(row.get("mode"), str) or row.get("straggler") not in cal.STRAGGLERS:
            raise BadInput(f"{path}: row {row.get('straggler')!r}/{row.get('mode')!r} is not a condition/mode of the bed")
    return bed


def measured(row: dict) -> Optional[float]:
    """The row's steady rate (after the first epoch: tracing and start-up excluded, what the model
    prices) where the bed recorded it, else its whole-run rate."""
    return row.get("steady_samples_per_s") or row.get("samples_per_s")


def emulated(bed: dict) -> bool:
    return bed.get("compute", "emulated") == "emulated"


def transient_steps(bed: dict, settings: Settings = DEFAULT) -> tuple:
    """(first, end, steps): the slow rank's own steps [first, end) of its `steps`, in a file whose
    transient window is in steps (the middle third)."""
    steps = cal.TRAIN_SAMPLES // settings.batch_size * bed["epochs"]
    first = steps // 3
    return first, max(first + 1, 2 * steps // 3), steps


def transient_fraction(bed: dict, settings: Settings = DEFAULT) -> float:
    """The share of its steps the transient straggler is slow, in a file whose window is in steps."""
    first, end, steps = transient_steps(bed, settings)
    return (end - first) / steps


def measured_samples(bed: dict, settings: Settings = DEFAULT) -> int:
    """The samples the measured rate covers: every epoch's but the first (the steady rate)."""
    return cal.TRAIN_SAMPLES // settings.batch_size * settings.batch_size * (bed["epochs"] - 1)


def transient_rate(bed: dict, slow: float, fast: float, settings: Settings = DEFAULT) -> float:
    """The rate of a run slowed to `slow` samples/s in the transient window, `fast` outside it."""
    if "transient_window_s" not in bed:
        share = transient_fraction(bed, settings)
        return 1.0 / (share / slow + (1 - share) / fast)
    first, end = bed["transient_window_s"]
    epoch = cal.TRAIN_SAMPLES // settings.batch_size * settings.batch_size

    def seconds_at(samples: float) -> float:  # after the first step: fast, slow in the window, fast
        before = fast * first
        if samples <= before:
            return samples / fast
        during = before + slow * (end - first)
        if samples <= during:
            return first + (samples - before) / slow
        return end + (samples - during) / fast

    # The measured rate spans the epochs after the first: the part of the window inside them.
    return measured_samples(bed, settings) / (seconds_at(epoch * bed["epochs"]) - seconds_at(epoch))


@functools.lru_cache(maxsize=None)
def _drawn(alpha: float, seed: int, ranks: int, first: int, end: int) -> np.ndarray:
    from tfsyncmodes.examples.emulated_compute import jitter_factors  # TensorFlow: only for heavy rows

    return np.stack([jitter_factors(f"pareto:{alpha:g}", seed, rank, end)[first:] for rank in range(ranks)], axis=1)


def run_delays(bed: dict, condition: str, settings: Settings = DEFAULT) -> Optional[np.ndarray]:
    """(steps, ranks): the Pareto factors a heavy row's ranks drew in the steps its measured rate
    spans (the epochs after the first). The trainer seeds each draw by (``--seed``, rank, step),
    so every run of a file drew the same ones; a short run's draws of a tail without a finite
    variance can sit far from the distribution's expectations. None: nothing to replay (another
    condition, real compute, or ``replay_draws`` off)."""
    if condition != "heavy" or not emulated(bed) or not settings.replay_draws:
        return None
    steps = cal.TRAIN_SAMPLES // settings.batch_size
    return _drawn(float(bed.get("pareto_alpha", 2.0)), int(bed.get("seed", 0)), bed["ranks"], steps,
                  steps * bed["epochs"])


def all_delays(bed: dict, settings: Settings = DEFAULT, steps: Optional[int] = None) -> Optional[np.ndarray]:
    """(steps, ranks): every factor a heavy row's ranks drew from their first step, for the
    schedules simulated from the start (hybrid's rounds, async's steps, the policy's windows);
    `steps` a rank (default: the run's global steps); None as :func:`run_delays`."""
    if not emulated(bed) or not settings.replay_draws:
        return None
    if steps is None:
        steps = cal.TRAIN_SAMPLES // settings.batch_size * bed["epochs"]
    return _drawn(float(bed.get("pareto_alpha", 2.0)), int(bed.get("seed", 0)), bed["ranks"], 0, steps)


def async_across(bed: dict) -> bool:
    """Whether the file's async runs crossed the namespaces' shaped links (else loopback)."""
    return str(bed.get("async_on", "")).startswith("namespaces")


def ps_link_factor(bed: dict) -> float:
    """The ps hosts' link over the workers' (``--ps_link``; 1 in files without it)."""
    return cal.LINK_CLASSES[bed.get("ps_link") or bed["link"]] / cal.LINK_CLASSES[bed["link"]]


def job(bed: dict, mode: str, condition: str, alpha_s: float, overhead_s: float,
        settings: Settings = DEFAULT, hybrid_s: float = 0.0, efficiency: float = 1.0) -> costs.Job:
    """The costs.Job of `mode` under `condition` (transient: its slow phase) as the bed ran it;
    `efficiency`: the share of the measured link rate a collective gets (fitted, see :func:`fit`)."""
    ranks = bed["ranks"]
    hybrid = knobs.KNOBS_BY_KEY
    on_loopback = mode == "async" and not async_across(bed)
    link = settings.loopback_gbit if on_loopback else efficiency * bed["measured_mbit_s"] / 1e3
    return costs.Job(ranks=ranks, ranks_per_host=bed["hosts"][0], step_ms=bed["emulated_step_ms"],
                     overhead_ms=overhead_s * 1e3, grad_mb=cal.emulated_parameters() * 4 / 1e6, link_gbit=link,
                     host_gbit=settings.loopback_gbit, latency_us=alpha_s * 1e6, batch=settings.batch_size // ranks,
                     straggler=cal.SLOW_FACTOR if condition in ("persistent", "transient") else 1.0,
                     pareto_alpha=bed.get("pareto_alpha", 2.0) if condition == "heavy" else 0.0,
                     period=hybrid["period"].default_for("hybrid"), epoch_steps=cal.TRAIN_SAMPLES // settings.batch_size,
                     local_steps=hybrid["local_steps"].default_for("hybrid"), hybrid_overhead_ms=hybrid_s * 1e3,
                     hybrid_slices=bed.get("hybrid_exchange") == "slices", ps=int(bed.get("ps", 1)),
                     ps_gbit=0.0 if on_loopback else link * ps_link_factor(bed),
                     down_gbit=0.0 if on_loopback else settings.loopback_gbit,  # the bed shapes egress only
                     plan_rule=bed.get("plan_rule", "nearest"))


def predict(bed: dict, mode: str, condition: str, alpha_s: float, overhead_s: float,
            settings: Settings = DEFAULT, hybrid_s: float = 0.0, efficiency: float = 1.0,
            policy_s: float = 0.0) -> Optional[float]:
    """Predicted samples/s of one row (`policy_s`: the straggler policy's own per-step cost;
    None: a row the model does not price)."""
    slow = job(bed, mode, condition, alpha_s, overhead_s, settings, hybrid_s, efficiency)
    if mode == "policy":
        return policy_rate(bed, slow, condition, settings, policy_s)
    if condition == "transient" and mode == "hybrid":
        return hybrid_transient(bed, slow, settings)
    if condition == "heavy" and mode == "hybrid" and slow.local_steps == "auto" and slow.hosts > 1:
        drawn = all_delays(bed, settings)
        if drawn is not None:
            return steady_rate(*simulate.hybrid_epochs(slow, bed["epochs"], delays=drawn))
    if mode == "async" and condition != "transient":
        simulated = async_rate(bed, slow, condition, settings)
        if simulated is not None:
            return simulated
    rate = costs.predict(slow, run_delays(bed, condition, settings))[mode]
    if condition != "transient":
        return rate
    fast = costs.predict(job(bed, mode, "none", alpha_s, overhead_s, settings, hybrid_s, efficiency))[mode]
    return transient_rate(bed, rate, fast, settings)


def hybrid_transient(bed: dict, slow: costs.Job, settings: Settings = DEFAULT) -> float:
    """Hybrid's steady rate under the transient straggler, simulated round by round
    (:func:`tfsyncmodes.costs.hybrid_epochs`): its plan learns each group's speed from the
    steps before, so it lags the window's start and end. Rated as the bed rates a run: the
    run's samples over its epochs, times the epochs after the first, over their seconds."""
    window, in_steps = straggler_window(bed, "transient", settings)
    ends, samples = simulate.hybrid_epochs(slow, bed["epochs"], window, in_steps)
    return steady_rate(ends, samples)


def async_rate(bed: dict, slow: costs.Job, condition: str, settings: Settings = DEFAULT) -> Optional[float]:
    """Async's steady rate simulated step by step (:func:`tfsyncmodes.simulate.async_epochs`):
    the trainer's epoch of ``TRAIN_SAMPLES // worker batch`` steps handed to the first free
    worker and joined at its end, heavy rows on every factor each worker drew from its first
    step; at most the servers' cap. None: a heavy row with nothing to replay."""
    closures = cal.TRAIN_SAMPLES // slow.batch
    delays = all_delays(bed, settings, closures * bed["epochs"]) if condition == "heavy" else None
    if condition == "heavy" and delays is None:
        return None
    rate = steady_rate(*simulate.async_epochs(slow, bed["epochs"], closures, delays))
    return min(rate, costs.async_capacity(slow) * slow.batch)


def steady_rate(ends: np.ndarray, samples: np.ndarray) -> float:
    """A simulated run rated as the bed rates one: its samples over its epochs, times the
    epochs after the first, over their seconds."""
    return float(samples.mean()) * (len(ends) - 1) / float(ends[-1] - ends[0])


def straggler_window(bed: dict, condition: str, settings: Settings = DEFAULT) -> tuple:
    """(window, in_steps) of the slow rank under `condition`: the transient window in seconds or
    in its own steps, else the whole run."""
    if condition != "transient":
        return (0.0, np.inf), False
    if "transient_window_s" in bed:
        return tuple(bed["transient_window_s"]), False
    return transient_steps(bed, settings)[:2], True


def policy_priced(bed: dict) -> bool:
    """Whether the policy's groups (two halves of the world) are the bed's hosts."""
    return bed["hosts"][0] == bed["ranks"] // 2


def switch_patience(bed: dict) -> int:
    """The policy's patience a bed file ran with: a ``--sync_switch_patience`` of its extra
    flags, else the default it recorded (``switch_patience``; before it was recorded, 2)."""
    return flag_value(str(bed.get("extra_flags") or ""), "--sync_switch_patience", int(bed.get("switch_patience", 2)))


def policy_rate(bed: dict, slow: costs.Job, condition: str, settings: Settings = DEFAULT,
                policy_s: float = 0.0) -> Optional[float]:
    """The straggler policy's steady rate, simulated step by step
    (:func:`tfsyncmodes.simulate_policy.policy_epochs`) with the trainer's switch settings; heavy rows
    replay the factors the bed's ranks drew in every epoch; the decision's rule is the one the
    file ran (``policy_rule``; before it was recorded, ``"mean"``), at its threshold
    (``switch_threshold``; before, 1.5) and patience (:func:`switch_patience`). The simulation's groups are the
    hosts; the policy's are two halves of the world (its default group size): None (not priced)
    where they differ, as at 8 ranks on hosts of 2."""
    if not policy_priced(bed):
        return None
    window, in_steps = straggler_window(bed, condition, settings)
    delays = all_delays(bed, settings) if condition == "heavy" else None
    defaults = knobs.KNOBS_BY_KEY
    ends, samples, _ = simulate_policy.policy_epochs(
        slow, bed["epochs"], window, in_steps, interval=int(defaults["switch_interval"].default),
        threshold=float(bed.get("switch_threshold", 1.5)), patience=switch_patience(bed),
        policy_overhead_ms=policy_s * 1e3, delays=delays, rule=bed.get("policy_rule", "mean"))
    return steady_rate(ends, samples)
