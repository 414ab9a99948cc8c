"""Every knob of tfsyncmodes, declared once: its config-file key, default, parser, help, and
when it applies. Its flag is ``--sync_<key>`` and its environment variable ``TFSYNC_<KEY>``.
The flags (:mod:`tfsyncmodes.flags`), the environment variables, the accepted config-file keys,
the validation, the warnings about knobs that have no effect and the configuration listing all
derive from :data:`KNOBS`. The values a registry accepts (modes, backends, compressors,
policies) are its names (:mod:`tfsyncmodes.registry`, known without importing the parts).

A knob's default is the same in every mode unless ``mode_defaults`` says otherwise; that is the
one place per-mode defaults are declared, and :func:`tfsyncmodes.config.resolve` applies them.
"""
from __future__ import annotations

from typing import Any, Mapping, Tuple

from tfsyncmodes import registry
from tfsyncmodes import schedule as schedule_lib
from tfsyncmodes.knob_types import (ENV_PREFIX, FLAG_PREFIX, Boolean, Choice, Knob, Number, Text, When, given,
                                    modes, rank_groups, schedule, slow_worker)

BUILTIN_MODES = ("sync", "async", "hybrid", "auto")  # the modes whose knobs are known here


def _local_steps_refused(text: str):
    """The old numbers of local_steps: N was a period of N inner steps, 0 the default one."""
    if not text.isdigit():
        return None
    if int(text) == 0:
        return (f"{text!r} is not accepted any more (it meant the default period)",
                "use fixed; the inner steps between averages are the knob period")
    return (f"{text!r} is not accepted any more (it meant a period of {text} inner steps)",
            f"use fixed with period={text}")


_OFF = dict(words=("off",), old={0: "off"})
_AUTO = dict(words=("auto",), old={0: "auto"})
_STRAGGLER = When(modes=("sync",), test=lambda v, m: v["switch_policy"] in ("straggler", "auto") or v["mode"] == "auto",
                  text="switch_policy=straggler or auto (or mode=auto)", keys=("switch_policy",))

_ELASTIC = When(("sync", "hybrid"), lambda v, m: bool(v["elastic"]), "mode=sync or hybrid with elastic on",
                ("elastic",))

TOPK = ("topk", "topk_int8", "topk_int4", "topk_int2")  # the Top-K compressions
QUANTIZED = ("int8", "int4", "int2", "topk_int8", "topk_int4", "topk_int2")  # the quantizing ones


def _dgc(values) -> bool:
    return bool(values["dgc"]) and values["compression"] in TOPK


def per_tensor_applies(values: Mapping[str, Any], mode: str) -> bool:
    """Whether compression_per_tensor acts in `mode`'s exchange, given the compression knobs."""
    if mode == "hybrid":
        return values["compression"] in TOPK + QUANTIZED
    shared = values["compression"] == "topk" and values["topk_shared_indices"]
    return values["compression"] != "none" and not _dgc(values) and not shared


_DGC = When(("sync",), lambda v, m: _dgc(v), "mode=sync with dgc on and a Top-K compression",
            ("dgc", "compression"))

KNOBS: Tuple[Knob, ...] = (
    Knob("mode", "sync", Choice(registry.MODES.names),
         "How replicas keep in step: sync (allreduce every step), async (parameter servers), "
         "hybrid (sync inside groups, averaged across them), auto (sync for a profile of the first steps, then hybrid if the cost model says it pays)."),
    Knob("backend", "auto", Choice(lambda: ("auto",) + registry.BACKENDS.names()),
         "Engine for sync mode. auto: horovod under horovodrun, multi_worker with a TF_CONFIG "
         "of several workers, mirrored otherwise.", modes("sync")),
    Knob("mode_schedule", "", Text(schedule, "phases MODE:LENGTH, e.g. sync:10%,hybrid:80%,sync"),
         "Run through several modes, e.g. 'sync:10%,hybrid:80%,sync' or 'sync:2e,async': phases "
         "of MODE:LENGTH, LENGTH a percentage of the steps, epochs (2e) or steps; the last phase "
         "may omit it. Empty: the whole run in one mode."),
    Knob("collective_timeout", 300.0, Number(float, 1.0, 86400.0),
         "Seconds a collective operation may wait for peers before the run fails instead of hanging."),
    Knob("elastic", False, Boolean(),
         "Sync or hybrid under horovodrun's elastic mode (--min-np/--max-np with "
         "--host-discovery-script): a lost rank rolls the others back to the last in-memory commit "
         "and training goes on; a rank the discovery script adds joins at the next commit with the "
         "state of rank 0; hybrid makes its groups again for every new world.",
         modes("sync", "hybrid")),
    Knob("elastic_commit", "epoch", Number(int, 1, 1 << 30, words=("epoch",)),
         "Elastic sync or hybrid: commit the state in memory at every epoch's end (epoch), or also "
         "every this many steps (hybrid: at the first round boundary from there); a lost rank costs "
         "at most the steps since the last commit.", _ELASTIC),
    Knob("elastic_join_timeout", 120.0, Number(float, 1.0, 86400.0),
         "Elastic sync or hybrid: seconds a re-forming world waits at Horovod's rendezvous for "
         "every rank (a rank that joins is a new process still starting). When it is above "
         "--sync_collective_timeout, Horovod starts at this timeout and then again at the "
         "collective one, so that a short collective timeout finds a lost rank soon without "
         "failing a slow join (not when HOROVOD_GLOO_TIMEOUT_SECONDS is set).", _ELASTIC),
    Knob("elastic_lr", "keep", Choice(lambda: ("keep", "scale")),
         "Elastic sync or hybrid, the learning rate when the world changes size: keep (each update "
         "stays the mean gradient at the same rate) or scale (the rate times size / size at start).",
         _ELASTIC),
    Knob("slow_worker", "", Text(slow_worker, "INDEX:FACTOR[@START%-END%], or empty"),
         "Fault injection for benchmarks: 'INDEX:FACTOR' makes worker INDEX take FACTOR times "
         "as long per step (e.g. 1:4.0); 'INDEX:FACTOR@START%-END%' only while the step is in "
         "that part of the run (e.g. 1:4.0@30%-60%; sync and hybrid). Empty: off."),
    # --- async ---
    Knob("ps_shards", 1, Number(int, 1, 1024),
         "Split each large variable over up to this many ps tasks (1: no sharding; tf_keras only).",
         modes("async")),
    Knob("min_shard_bytes", 256 << 10, Number(int, 1, 1 << 40),
         "A variable shard holds at least this many bytes.",
         When(("async",), lambda v, m: v["ps_shards"] > 1, "mode=async and ps_shards > 1", ("ps_shards",))),
    Knob("clip_norm", "off", Number(float, 0.0, 1e9, above=True, **_OFF),
         "Clip each update's gradients to this global norm.", modes("async")),
    Knob("staleness_aware_lr", True, Boolean(),
         "Async: scale each update by 1/(1+staleness), staleness = updates that landed between "
         "the worker's read and its write. Hybrid with cross_group=stale: scale each of the other "
         "groups' updates by 1/(1+steps it is applied late).",
         When(("async", "hybrid"), lambda v, m: m == "async" or v["cross_group"] == "stale",
              "mode=async, or mode=hybrid with cross_group=stale", ("cross_group",))),
    Knob("lr_decay", "off", Number(float, 0.0, 1e3, above=True, **_OFF),
         "Scale update n by 1/(1 + lr_decay * n) (inverse-time decay).", modes("async")),
    Knob("max_staleness", "off", Number(int, 0, 1 << 30, words=("off",), old={-1: "off"}),
         "Drop (scale to zero) an update staler than this many updates, as the SSP bound; the "
         "count is logged as dropped_updates (0: keep only fresh updates).", modes("async")),
    Knob("delay_compensation", "off", Number(float, 0.0, 1e3, above=True, **_OFF),
         "DC-ASGD: correct each gradient g computed on weights w_read and applied to w_now with "
         "g + LAMBDA * g * g * (w_now - w_read) (the paper uses 0.04).", modes("async")),
    Knob("exactly_once", True, Boolean(),
         "Async: a lost worker's step is applied once. Its writes (update, metrics, counters) "
         "are made as one unit on the parameter server, which marks the step; the coordinator's "
         "re-run of a marked step is skipped. Needs one ps task, and a model's own train_step "
         "to make its writes with strategy.one_unit (logged otherwise), and a unit without "
         "loops, where a lost worker's step can be cut on the server (logged otherwise). "
         "false: at least once.",
         modes("async")),
    Knob("steps_ahead", 0, Number(int, 0, 1 << 20),
         "Async (Keras 3): steps of the next epoch scheduled before the loop waits for an "
         "epoch's last steps, so the workers done go on while those end and the chief's end "
         "callbacks run; each epoch's metrics stay its own, but the callbacks may see up to "
         "this many of the next epoch's updates, and what a callback sets at the next epoch's "
         "start applies after them (0: none, as Keras' fit).",
         modes("async")),
    # --- hybrid ---
    Knob("group_size", "host", Number(int, 1, 1 << 20, words=("host",), old={0: "host"}),
         "Ranks 0..S-1 form group 0, S..2S-1 group 1, ... (host: one group per host).",
         When(("hybrid",), lambda v, m: not v["groups"], "mode=hybrid without groups", ("groups",))),
    Knob("groups", "", Text(rank_groups, "ranks by ',', groups by ';', e.g. 0,1;2,3, or empty"),
         "Explicit groups of Horovod ranks, e.g. '0,1;2,3' (instead of group_size).", modes("hybrid")),
    Knob("compression", "none", Choice(registry.COMPRESSORS.names),
         "Sync (under Horovod): how gradients travel in the allreduce; hybrid: how updates travel "
         "across groups. none (float32), fp16 (half the bytes), topk (the topk_ratio largest "
         "entries as values + int32 indices, with error feedback), int8, int4, int2 (every entry "
         "as a code of that many bits, packed into bytes, with a float32 offset and scale; "
         "allgathered), topk_int8, topk_int4, topk_int2 (topk with its values quantized so and "
         "its indices packed in 2 bytes each, as SparseLoCo).", modes("sync", "hybrid")),
    Knob("topk_ratio", 0.01, Number(float, 1e-6, 1.0),
         "Fraction of entries a Top-K compression (topk, topk_int8, topk_int4, topk_int2) sends each step.",
         given("compression", *TOPK, modes=("sync", "hybrid"), text="compression=topk or topk_int*")),
    Knob("topk_shared_indices", False, Boolean(),
         "Sync with compression=topk: every rank sends its values at the union of all ranks' "
         "Top-K indices (one allgather of the indices), and the values add in one allreduce, so "
         "each selected entry gets every rank's part in the same step (allgathered Top-K: only "
         "the ranks that selected it). Up to ranks x the values per step.",
         When(("sync",), lambda v, m: v["compression"] == "topk", "mode=sync with compression=topk",
              ("compression",))),
    Knob("compression_per_tensor", False, Boolean(),
         "Each tensor compressed on its own (one scale or one Top-K selection per tensor), as "
         "Horovod's compression does, instead of the whole model as one vector. Sync: each "
         "gradient compressed, sent and decompressed on its own as it comes, with a residual of "
         "its own (not with dgc, nor with topk_shared_indices under topk). Hybrid: the model's "
         "change still crosses as one vector, one payload of every tensor's part (a Top-K or "
         "quantizing compression; a streaming fragment is compressed whole).",
         When(("sync", "hybrid"), per_tensor_applies,
              "mode=sync with a compression, without dgc or topk_shared_indices; mode=hybrid with a "
              "Top-K or quantizing compression", ("compression", "dgc", "topk_shared_indices"))),
    Knob("quantize_sigma", 6.0, Number(float, 0.0, 1e3, above=True),
         "A quantizing compression's range is the tensor's own, clipped to mean +- this many "
         "standard deviations (INTELLECT-1 uses 6); what is clipped stays in the error feedback.",
         given("compression", *QUANTIZED, modes=("sync", "hybrid"), text="compression=int* or topk_int*")),
    Knob("error_feedback", True, Boolean(),
         "Add what compression dropped back into the next step's update.",
         When(("sync", "hybrid"), lambda v, m: v["compression"] != "none" and not (m == "sync" and _dgc(v)),
              "compression other than none (and not dgc in sync)", ("compression", "dgc"))),
    Knob("dgc", False, Boolean(),
         "Sync with a Top-K compression: Deep Gradient Compression's corrections. Momentum "
         "correction with momentum factor masking (each rank accumulates u = dgc_momentum * u + g, "
         "v = v + u, sends the Top-K of v and zeroes u and v where it sent; the inner optimizer "
         "should be SGD without momentum), local clipping (dgc_clip_norm) and the sparsity "
         "warm-up (dgc_warmup_steps).",
         When(("sync",), lambda v, m: v["compression"] in TOPK, "mode=sync with compression=topk or topk_int*",
              ("compression",))),
    Knob("dgc_momentum", 0.9, Number(float, 0.0, 0.999),
         "DGC's momentum m of u = m * u + g.", _DGC),
    Knob("dgc_masking", True, Boolean(),
         "DGC's momentum factor masking: zero u where v was sent (false: u keeps its momentum, so "
         "that at full density the update is SGD with momentum m, where masking makes it SGD "
         "without).", _DGC),
    Knob("dgc_clip_norm", "off", Number(float, 0.0, 1e9, above=True, **_OFF),
         "DGC's local clipping: each rank clips its gradient to this global norm / sqrt(ranks) "
         "before accumulating it (off: no clipping).", _DGC),
    Knob("dgc_warmup_steps", 0, Number(int, 0, 1 << 30),
         "DGC's sparsity warm-up: over the first this many steps Top-K sends 25 %, 6.25 %, "
         "1.5625 %, ... of the entries (equal shares of the steps), then topk_ratio (0: no warm-up).",
         _DGC),
    Knob("staleness", 7, Number(int, 0, 1000),
         "A group may apply the other groups' updates at most this many steps late, and run at "
         "most this many steps ahead of the slowest group (0: lockstep).", given("cross_group", "stale")),
    Knob("period", 8, Number(int, 1, 1 << 20),
         "Inner steps between two cross-group averages (with local_steps=auto: the fastest "
         "group's inner steps per round).", given("cross_group", "periodic", "elastic")),
    Knob("cross_group", "periodic", Choice(registry.CROSS_GROUP.names),
         "How groups exchange: periodic (local SGD: groups average their model changes every "
         "period steps, and their models at the end), stale (a background exchange every step, "
         "applied at most staleness steps late), elastic (EASGD: groups and a center copy pull "
         "toward each other every period steps; the final model is the center).", modes("hybrid")),
    Knob("outer_optimizer", "average", Choice(registry.OUTER_OPTIMIZERS.names),
         "How the groups' mean change is applied at each average: average (anchor + outer_lr * "
         "mean change) or nesterov (SGD with Nesterov momentum on the pseudo-gradient, as DiLoCo).",
         given("cross_group", "periodic")),
    Knob("outer_lr", "auto", Number(float, 0.0, 10.0, above=True, **_AUTO),
         "The outer optimizer's learning rate (auto: 1.0 for average, 0.7 for nesterov).",
         given("cross_group", "periodic")),
    Knob("outer_momentum", "auto", Number(float, 0.0, 0.999, words=("auto",)),
         "The nesterov outer optimizer's momentum (auto: DiLoCo's 0.9 from a period of 500 "
         "inner steps, the regime it was tuned for; 0.3 below, as measured at periods 8 and 32).",
         When(("hybrid",), lambda v, m: v["cross_group"] == "periodic" and v["outer_optimizer"] == "nesterov",
              "cross_group=periodic and outer_optimizer=nesterov", ("cross_group", "outer_optimizer"))),
    Knob("fragments", 1, Number(int, 1, 1 << 10),
         "Streaming DiLoCo: average the model in this many equal blocks of its flattened entries, "
         "block p after the steps where (step - p * period / fragments) is a multiple of period, "
         "so each exchange carries about 1/fragments of the model (1: the whole model at once). "
         "At most period; local_steps is fixed with more than 1 (an explicit auto is refused).",
         given("cross_group", "periodic")),
    Knob("warmup_steps", 0, Number(int, 0, 1 << 30),
         "The first this many steps exchange across groups at every step, in lockstep.", modes("hybrid")),
    Knob("elastic_alpha", "auto", Number(float, 0.0, 1.0, above=True, **_AUTO),
         "The elastic coefficient alpha: the center moves alpha * (sum of the groups' differences "
         "to it), then each group moves groups * alpha of the way to the new center (auto: the "
         "EASGD paper's 0.9 / groups; 1 / groups is periodic averaging; groups * alpha <= 1).",
         given("cross_group", "elastic")),
    Knob("local_steps", "auto", Choice(lambda: ("fixed", "auto"), _local_steps_refused),
         "Inner steps per round: auto (each group as many as its measured speed allows, the "
         "fastest period, and the average weights groups by the samples they processed: Async "
         "Local-SGD's dynamic local updates; groups of equal speed run period each), or fixed "
         "(period for every group, so a slow group holds every round back; the hybrid phase of "
         "a --sync_mode_schedule run and an elastic hybrid run are always fixed; the straggler "
         "policy's runs auto).",
         given("cross_group", "periodic")),
    # --- online switching (tfsyncmodes/switching/) ---
    Knob("switch_policy", "none", Choice(lambda: ("none", "straggler", "auto")),
         "Under horovodrun: straggler moves a sync run to hybrid (one group per host across hosts, "
         "else the slow ranks in one group) "
         "while sync's step (the slowest rank's, or the longest of the ranks' steps one by one) "
         "over the median rank's stays at or above switch_threshold, and back to sync once it "
         "falls; auto (what mode=auto runs) "
         "profiles the first 2 * switch_interval steps, predicts each mode's "
         "rate with the cost model, switches to hybrid for good if it pays, else goes on as "
         "straggler (none: stay in one mode).",
         When(("sync",), lambda v, m: v["mode"] != "auto", "mode=sync")),
    Knob("switch_threshold", 1.3, Number(float, 1.01, 1e3),
         "Sync's step over the median rank's that counts as a straggler: the slowest rank's "
         "mean, or sync's mean step with the longest of the ranks' steps taken one by one, "
         "whichever is larger (back to sync below 1 + (threshold - 1) / 2).", _STRAGGLER),
    Knob("switch_interval", 10, Number(int, 2, 1 << 20),
         "Every this many steps the ranks exchange their mean step time and decide.", _STRAGGLER),
    Knob("switch_patience", 1, Number(int, 1, 1000),
         "Consecutive windows above (or below) the threshold before a switch (hysteresis).", _STRAGGLER),
)
KNOBS_BY_KEY: Mapping[str, Knob] = {knob.key: knob for knob in KNOBS}


def run_modes(values: Mapping[str, Any]) -> Tuple[str, ...]:
    """The modes a run of these resolved values trains in: a schedule's, auto's candidates,
    sync and hybrid under the straggler policy, else the one mode."""
    if values.get("mode_schedule"):

        return schedule_lib.modes(values["mode_schedule"])
    if values["mode"] == "auto":
        return ("sync", "hybrid")
    if values.get("switch_policy") in ("straggler", "auto"):
        return tuple(dict.fromkeys((values["mode"], "hybrid")))
    return (values["mode"],)


def in_force(knob: Knob, values: Mapping[str, Any]) -> bool:
    """Whether `knob` acts in a run of these resolved values: it applies in one of the run's
    modes (a mode not declared here, e.g. a user's: every knob may)."""
    return any(mode not in BUILTIN_MODES or knob.applies(values, mode) for mode in run_modes(values))
