"""The emulated cluster bed: when each mode pays, with ranks that hold almost no core.

    python -m benchmarks.bed --ranks=4 --link=1gbit --straggler=none,persistent \
        --modes=sync,hybrid,async --repeats=3 --epochs=3

Needs root (network namespaces) and OpenSSH. The ranks are ``scripts/train.py`` on the digits
(a real MLP, a real optimizer), on hosts that are network namespaces (tfsync_testbed.netns, two
ranks per host, at least two hosts) joined over a bridge whose every host link is shaped to the
link class (tc tbf); sync and hybrid run as ``horovodrun -H hostA:2,hostB:2,... --gloo`` over SSH
(hybrid: one group per host). Async runs across the namespaces too (:mod:`benchmarks.bed_async`):
the chief and ``--ps`` parameter servers on hosts of their own (one more namespace each, its link
shaped alike), the workers on the ranks' hosts, every task ``scripts/train.py`` with its
TF_CONFIG; every worker's pulls and pushes cross the shaped links (older files ran async on
loopback, unshaped: their ``async_on`` says so). Every step waits its emulated compute
(``--compute_ms``), calibrated to ResNet-50 on V100s as :mod:`benchmarks.bed_calibration` works
out; ``--compute=real`` drops the wait (the real MLP's CPU time only) as a sanity check.

Per mode and condition, the median over --repeats of: throughput (samples/s), each worker's own
rate (Horovod ranks step together; the async coordinator does not say which worker ran a
step: null), seconds to sync's 1/4, 1/2 and 3/4 loss drop (from ln 10 to sync's final loss, at
epoch ends), final test accuracy. JSON: docs/bed_<ranks>r_<link>.json; a section of
docs/BENCHMARKS.md.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

from benchmarks import bed_async, bed_calibration as cal, bed_capture, bed_probe
from benchmarks.bed_report import (accuracy_ratios, auto_pick, median_or_none, ratios_to_sync, seconds_to, section,
                                   whole_run_ratios)
from benchmarks.benchlib import DOCS, REPO, TRAIN, bad_flag, check_bed_counts, flag_value, replace_section, repo_env
from tfsync_testbed import localrun, shaping

flags.DEFINE_integer("ranks", 4, "Horovod ranks / async workers: 2, 4 or 8 (1: an async worker alone).")
flags.DEFINE_enum("link", "1gbit", list(cal.LINK_CLASSES), "Link class between the hosts (scaled, see bed_calibration).")
flags.DEFINE_list("straggler", ["none", "persistent"], "Conditions: " + ", ".join(cal.STRAGGLERS) + ".")
flags.DEFINE_list("modes", ["sync", "hybrid", "async"], "Modes: sync, hybrid, async, policy (sync with the "
                  "straggler policy), auto (--sync_mode=auto: its pick is recorded).")
flags.DEFINE_integer("repeats", 3, "Runs of every mode and condition.")
flags.DEFINE_integer("epochs", 3, "Epochs of every run.")
flags.DEFINE_integer("batch_size", 64, "Global batch of a sync/hybrid step (an async worker's: this / --ranks).")
flags.DEFINE_enum("compute", "emulated", ["emulated", "real"], "emulated: the calibrated sleep; real: none.")
flags.DEFINE_float("step_ms", cal.EMU_STEP_MS, "Emulated compute of a rank's step, ms; the links slow with it, so "
                   "the compute : communication ratio stays the named workload's (more ranks than cores: a "
                   "longer step leaves the ranks' own CPU work a smaller share of it).")
flags.DEFINE_float("pareto_alpha", 2.0, "ALPHA of the heavy condition's Pareto per-step times (> 1).")
flags.DEFINE_float("timeout", 900.0, "Seconds one run may take.")
flags.DEFINE_string("python", None, "The interpreter of the ranks and tasks (default: the one running this).")
flags.DEFINE_string("docs_dir", DOCS, "Where the JSON and BENCHMARKS.md go.")
flags.DEFINE_string("render", None, "Run nothing: write the BENCHMARKS.md section of this bed JSON again.")
flags.DEFINE_integer("ps", 1, "Async's parameter servers, each on a host of its own; more than one splits every "
                     "kernel over them (--sync_ps_shards) under tf_keras, which alone updates split variables.")
flags.DEFINE_enum("ps_link", None, list(cal.LINK_CLASSES), "Async: the link class of the hosts of the ps tasks "
                  "(the chief is on the first), scaled as --link is (default: --link's).")
flags.DEFINE_float("queue_ms", 50.0, "The longest a packet may wait in a host's shaped queue (tbf's latency): "
                   "the queue holds this many ms of the link's rate, so fewer bytes at a slower --step_ms "
                   "(scale it with --step_ms to keep the bytes of 50 ms steps).")
flags.DEFINE_integer("first_bytes", 0, "Queue every host's packets under this many bytes apart and send them "
                     "first (1024: requests, replies and acknowledgements, as a host's flow queuing keeps them from "
                     "waiting behind bulk data; tfsync_testbed/shaping.py); 0: one queue, as every earlier file.")
flags.DEFINE_integer("flow_queues", 0, f"Queue each connection apart on every host, served in turn ({shaping.FLOWS}: "
                     "classes by the ports, as a Linux host's fq_codel keeps connections apart; "
                     "tfsync_testbed/shaping.py); 0: one queue, as every earlier file.")
flags.DEFINE_bool("tcp_slow_start_after_idle", True, "The hosts' net.ipv4.tcp_slow_start_after_idle (the "
                  "kernel's default, 1: a connection idle for a retransmission timeout starts slow again).")
flags.DEFINE_string("capture_dir", "", "Capture packet headers on every host while the runs go, one file a host "
                    "there (tcpdump; read back with python -m benchmarks.bed_capture DIR); empty: none.")
flags.DEFINE_string("extra_flags", "", "More trainer flags for every run, space-separated (e.g. '--sync_period=16').")
FLAGS = flags.FLAGS
MODES = ("sync", "hybrid", "async", "policy", "auto")  # policy: sync with --sync_switch_policy=straggler
TRAIN_SAMPLES = cal.TRAIN_SAMPLES


def bad(field: str, problem: str, fix: str) -> None:
    bad_flag("benchmarks.bed", field, problem, fix)


def check() -> None:
    check_bed_counts("benchmarks.bed", FLAGS, (1, 2, 4, 8))
    if FLAGS.capture_dir and not shutil.which("tcpdump"):
        bad("capture_dir", "needs tcpdump, which is not installed", "apt-get install tcpdump, or leave it out")
    if FLAGS.ranks == 1 and FLAGS.modes != ["async"]:
        bad("ranks", "1 runs an async worker alone (its own rate), no other mode", "use --modes=async, or 2, 4 or 8")
    for name in FLAGS.straggler:
        if name not in cal.STRAGGLERS:
            bad("straggler", f"{name!r} is not a condition", "use " + ", ".join(cal.STRAGGLERS))
    for mode in FLAGS.modes:
        if mode not in MODES:
            bad("modes", f"{mode!r} is not a mode of the bed", "use " + ", ".join(MODES))
    if FLAGS.batch_size % FLAGS.ranks or FLAGS.batch_size < FLAGS.ranks:
        bad("batch_size", f"{FLAGS.batch_size} does not split over {FLAGS.ranks} ranks", f"use a multiple of {FLAGS.ranks}")
    if not (math.isfinite(FLAGS.pareto_alpha) and FLAGS.pareto_alpha > 1):
        bad("pareto_alpha", f"{FLAGS.pareto_alpha} is not accepted", "use a number > 1, e.g. 2")
    if not 1 <= FLAGS.ps <= 4:
        bad("ps", f"{FLAGS.ps} parameter servers", "use 1 to 4 (each is a host of its own)")
    if FLAGS.ps > 1 and "async" not in FLAGS.modes:
        bad("ps", f"{FLAGS.ps} parameter servers but no async run", "add async to --modes, or leave --ps at 1")
    if FLAGS.ps_link and "async" not in FLAGS.modes:
        bad("ps_link", f"{FLAGS.ps_link} for the ps hosts but no async run", "add async to --modes, or leave --ps_link out")
    if not shaping.first_bytes_ok(FLAGS.first_bytes):
        bad("first_bytes", f"{FLAGS.first_bytes} is not accepted", "use 0 (one queue) or a power of two from 64 to 4096, e.g. 128")
    if not shaping.flows_ok(FLAGS.flow_queues):
        bad("flow_queues", f"{FLAGS.flow_queues} is not accepted", f"use 0 (one queue) or {shaping.FLOWS}")
    if FLAGS.flow_queues and FLAGS.first_bytes:
        bad("flow_queues", "flow queues and --first_bytes are two ways to queue a host's packets",
            "use one of them (the other at 0)")
    if not (math.isfinite(FLAGS.queue_ms) and FLAGS.queue_ms >= 1):
        bad("queue_ms", f"{FLAGS.queue_ms} is not accepted", "use milliseconds >= 1 (tbf's default here: 50)")
    if not (math.isfinite(FLAGS.step_ms) and FLAGS.step_ms >= 1):
        bad("step_ms", f"{FLAGS.step_ms} is not accepted", "use milliseconds >= 1, e.g. 200 for 8 ranks on 2 cores")
    try:
        seed_of(FLAGS.extra_flags)
    except ValueError:
        bad("extra_flags", "its --seed is not a whole number", "use e.g. --extra_flags='--seed=1'")


def hosts_layout(ranks: int) -> list:
    """Ranks per host: two per host, at least two hosts (one: an async worker alone on its host)."""
    if ranks == 1:
        return [1]
    hosts = max(2, ranks // 2)
    return [ranks // hosts] * hosts


def seed_of(extra_flags: str) -> int:
    """The trainer's --seed among `extra_flags` (its default, 0, if none): it seeds the emulated
    compute's draws too, which the cost model replays."""
    return flag_value(extra_flags, "--seed", 0)


def train_flags(mode: str, condition: str, work: str) -> list:
    horovod = mode != "async"
    batch = FLAGS.batch_size if horovod else FLAGS.batch_size // FLAGS.ranks
    steps_per_worker = TRAIN_SAMPLES // FLAGS.batch_size * FLAGS.epochs
    out = ["--sync_mode=sync", "--sync_switch_policy=straggler"] if mode == "policy" else [f"--sync_mode={mode}"]
    out += [f"--epochs={FLAGS.epochs}", f"--batch_size={batch}",
           f"--hidden_units={cal.HIDDEN_UNITS}", "--eval_each_epoch", f"--model_dir={work}/model",
           f"--metrics_file={work}/metrics.json"]
    out += FLAGS.extra_flags.split()
    if FLAGS.compute == "emulated":  # a step on the global batch: every rank's part waits --step_ms
        out.append(f"--compute_ms={FLAGS.step_ms * (FLAGS.ranks if horovod else 1):g}")
        out += cal.straggler_flags(condition, steps_per_worker, FLAGS.pareto_alpha, FLAGS.ranks, FLAGS.link,
                                   FLAGS.step_ms)
    elif condition != "none":
        out += {"persistent": ["--sync_slow_worker=1:4"]}.get(condition, [])
    return out


def run_horovod(bed, mesh, env, mode: str, condition: str, work: str) -> subprocess.CompletedProcess:
    hosts = ",".join(f"{h.name}:{n}" for h, n in zip(bed.hosts, hosts_layout(FLAGS.ranks)))
    python = FLAGS.python or sys.executable
    # Horovod's launcher under the ranks' own interpreter (what the horovodrun script runs).
    command = [*localrun.horovodrun(python), "-np", str(FLAGS.ranks), "-H", hosts, "--network-interface", "tfs0",
               *mesh.horovodrun_args(), "--gloo", python, TRAIN,
               *train_flags(mode, condition, work)]
    return bed.hosts[0].run(command, timeout=FLAGS.timeout, env=env, cwd=REPO)


def run_async(bed, env, condition: str, work: str) -> subprocess.CompletedProcess:
    spec = bed_async.cluster(bed.hosts, FLAGS.ranks, len(hosts_layout(FLAGS.ranks)), FLAGS.ps)
    command = [FLAGS.python or sys.executable, TRAIN, *train_flags("async", condition, work), *bed_async.flags_for(FLAGS.ps)]
    return bed_async.run(bed.hosts, spec, bed_async.env_for(env, FLAGS.ps), command, work, REPO, FLAGS.timeout)


def summarise(mode: str, metrics: dict) -> dict:
    horovod = mode != "async"
    samples = metrics.get("samples", metrics["steps"] * metrics["batch_size"])  # hybrid: every group's
    rate = samples / metrics["train_seconds"]
    seconds = metrics.get("epoch_seconds", [])
    steady = None  # after the first epoch (tracing, start-up and the first exchanges excluded)
    if len(seconds) > 1 and seconds[-1] > seconds[0]:
        per_epoch = samples / len(seconds)  # epochs of equal samples (a hybrid run's: near enough)
        steady = per_epoch * (len(seconds) - 1) / (seconds[-1] - seconds[0])
    return {"samples_per_s": rate, "steady_samples_per_s": steady,
            "worker_rates": [rate / FLAGS.ranks] * FLAGS.ranks if horovod else None,
            "test_accuracy": metrics["test_accuracy"], "losses": metrics["losses"],
            "epoch_seconds": metrics.get("epoch_seconds", []), "train_seconds": metrics["train_seconds"],
            "local_steps": {k: v for k, v in metrics.items() if k.startswith("local_steps_")},
            "first_step_seconds": metrics.get("first_step_seconds"),
            "epoch_accuracy": metrics.get("epoch_accuracy", []),
            **{k: metrics[k] for k in ("modes", "mode_switches", "switch_seconds") if k in metrics}}


def main(argv):
    del argv
    if FLAGS.render:
        render(FLAGS.render)
        return
    check()
    from tfsync_testbed import netns, ssh

    from benchmarks.linkrate import link_rate

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFSYNC_", "HOROVOD_"))}
    env = repo_env(env, TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="2")
    with tempfile.TemporaryDirectory() as tmp, netns.HostBed(len(hosts_layout(FLAGS.ranks)) + FLAGS.ps * ("async" in FLAGS.modes)) as bed, \
            ssh.SshMesh(bed, tmp) as mesh:
        def shape(link, hosts=None):
            bed.shape(cal.tc_rate(link, FLAGS.step_ms), burst=cal.tc_burst(link, FLAGS.step_ms),
                      latency=f"{FLAGS.queue_ms:g}ms", hosts=hosts, first_bytes=FLAGS.first_bytes,
                      flows=FLAGS.flow_queues)

        shape(FLAGS.link)
        if FLAGS.ps_link:  # the hosts after the ranks' hold the chief and the ps tasks
            shape(FLAGS.ps_link, bed.hosts[len(hosts_layout(FLAGS.ranks)):])
        bed.sysctl("net.ipv4.tcp_slow_start_after_idle", str(int(FLAGS.tcp_slow_start_after_idle)))
        measured = link_rate(bed) * 8
        print(f"[bed] link {FLAGS.link}: shaped {cal.tc_rate(FLAGS.link, FLAGS.step_ms)}, measured {measured / 1e6:.2f} Mbit/s", flush=True)
        capture = (bed_capture.capturing(bed.hosts, FLAGS.capture_dir, netns.IFACE) if FLAGS.capture_dir
                   else contextlib.nullcontext())
        with capture:
            runs = run_all(bed, mesh, env, tmp)
    write(runs, measured)


def run_all(bed, mesh, env, tmp: str) -> dict:
    """Every repeat, condition and mode on `bed`, each run's files in a directory under `tmp`."""
    runs = {}
    for repeat in range(FLAGS.repeats):
        for condition in FLAGS.straggler:
            for mode in FLAGS.modes:
                work, probe = tempfile.mkdtemp(dir=tmp), bed_probe.Probe(bed)
                try:
                    result = (run_async(bed, env, condition, work) if mode == "async"
                              else run_horovod(bed, mesh, mesh.env(env), mode, condition, work))
                except subprocess.TimeoutExpired as error:  # killed: show where it stood
                    sys.stderr.write(str(error.stdout or "")[-3000:] + str(error.stderr or "")[-6000:])
                    sys.exit(f"benchmarks.bed: {mode} / {condition} did not end within --timeout={FLAGS.timeout:g} s")
                if result.returncode != 0 or not os.path.exists(f"{work}/metrics.json"):
                    kept = os.path.join(FLAGS.docs_dir, f"bed-failed-{mode}-{condition}.log")
                    with open(kept, "w", encoding="utf-8") as handle:  # the whole output: the tail may be a dump
                        handle.write(result.stdout + "\n--- stderr ---\n" + result.stderr)
                    sys.stderr.write(result.stdout[-2000:] + result.stderr[-4000:])
                    sys.exit(f"benchmarks.bed: {mode} / {condition} failed with status {result.returncode} "
                             f"(its whole output: {kept})")
                with open(f"{work}/metrics.json", encoding="utf-8") as handle:
                    run = summarise(mode, json.load(handle))
                run["repeat"] = repeat
                run.update(probe.read())  # the links' drops and resends, the cores busy
                if mode == "auto":
                    run.update(auto_pick(result.stdout + result.stderr))
                runs.setdefault((condition, mode), []).append(run)
                print(f"[bed] {repeat + 1}/{FLAGS.repeats} {condition} {mode}: {run['samples_per_s']:.0f} "
                      f"samples/s, accuracy {run['test_accuracy']:.3f}", flush=True)
    return runs


def write(runs: dict, measured: float) -> None:
    from tfsyncmodes import knobs  # TensorFlow's start-up lines: not before a bad flag's one line

    rows = []
    for (condition, mode), done in runs.items():
        sync = runs.get((condition, "sync")) or runs.get(("none", "sync"))
        final = statistics.median(r["losses"][-1] for r in sync) if sync else None
        targets = {f: math.log(10) - f * (math.log(10) - final) for f in (0.25, 0.5, 0.75)} if final else {}
        rows.append({"straggler": condition, "mode": mode,
                     "samples_per_s": median_or_none([r["samples_per_s"] for r in done]),
                     "samples_per_s_runs": [round(r["samples_per_s"], 1) for r in done],
                     "steady_samples_per_s": median_or_none([r["steady_samples_per_s"] for r in done]),
                     "steady_samples_per_s_runs": [r["steady_samples_per_s"] and round(r["steady_samples_per_s"], 1) for r in done],
                     "worker_rates": done[0]["worker_rates"] and [median_or_none(v) for v in zip(*(r["worker_rates"] for r in done))],
                     "seconds_to_sync_loss_drop": {str(f): median_or_none([seconds_to(r, t) for r in done]) for f, t in targets.items()},
                     "ratio_to_sync_runs": ratios_to_sync(done, sync or [], targets),
                     "whole_run_ratio_runs": whole_run_ratios(done, sync or []),
                     "sync_accuracy_ratio_runs": accuracy_ratios(done, sync or []),
                     "test_accuracy_runs": [round(r["test_accuracy"], 4) for r in done],
                     "test_accuracy": median_or_none([r["test_accuracy"] for r in done]),
                     **({"auto_picks": [r["auto_pick"] for r in done],
                         "auto_predicted_gains": [r["auto_predicted_gain"] for r in done]} if mode == "auto" else {})})
    result = {"ranks": FLAGS.ranks, "hosts": hosts_layout(FLAGS.ranks), "link": FLAGS.link, "compute": FLAGS.compute,
              "shaped": cal.tc_rate(FLAGS.link, FLAGS.step_ms), "measured_mbit_s": round(measured / 1e6, 2),
              "expected_sync_comm_ms": round(1000 * cal.ring_comm_seconds(FLAGS.ranks, FLAGS.link, FLAGS.step_ms), 1),
              "emulated_step_ms": FLAGS.step_ms, "hybrid_exchange": "slices", "plan_rule": "most_steps", "policy_rule": "barrier", "reads_after_wait": True, "async_reads_ahead": False,
              "switch_threshold": knobs.KNOBS_BY_KEY["switch_threshold"].default, "switch_patience": knobs.KNOBS_BY_KEY["switch_patience"].default, "epochs": FLAGS.epochs, "repeats": FLAGS.repeats,
              "stragglers": FLAGS.straggler, "modes": FLAGS.modes,
              "pareto_alpha": FLAGS.pareto_alpha, "seed": seed_of(FLAGS.extra_flags), "extra_flags": FLAGS.extra_flags,
              "tcp_slow_start_after_idle": FLAGS.tcp_slow_start_after_idle, "queue_ms": FLAGS.queue_ms, "batch_size": FLAGS.batch_size, "first_bytes": FLAGS.first_bytes,
              "flow_queues": FLAGS.flow_queues,
              "ps_link": FLAGS.ps_link or FLAGS.link,
              "transient_window_s": list(cal.transient_window_seconds(TRAIN_SAMPLES // FLAGS.batch_size * FLAGS.epochs,
                                                                      FLAGS.ranks, FLAGS.link, FLAGS.step_ms)),
              "async_on": bed_async.describe(FLAGS.ps), "ps": FLAGS.ps, "rows": rows,
              "runs": [{"straggler": c, "mode": m, **run} for (c, m), done in runs.items() for run in done]}
    name = f"bed_{FLAGS.ranks}r_{FLAGS.link}{'' if FLAGS.compute == 'emulated' else '_real'}"
    os.makedirs(FLAGS.docs_dir, exist_ok=True)
    with open(os.path.join(FLAGS.docs_dir, name + ".json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    replace_section(os.path.join(FLAGS.docs_dir, "BENCHMARKS.md"), name, section(result, name))


def render(path: str) -> None:
    """--render: the section of a bed run's JSON written again (named after the file)."""
    try:
        with open(path, encoding="utf-8") as handle:
            result = json.load(handle)
        name = os.path.splitext(os.path.basename(path))[0]
        text = section(result, name)
    except (OSError, ValueError, KeyError, TypeError) as error:
        bad("render", f"{path} is not a bed run's JSON ({error.__class__.__name__}: {error})",
            "name a docs/bed_*.json file the bed wrote")
    replace_section(os.path.join(FLAGS.docs_dir, "BENCHMARKS.md"), name, text)


if __name__ == "__main__":
    app.run(main)
