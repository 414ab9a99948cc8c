"""Benchmark: sync and hybrid step time across 2 hosts over a rate-limited link, against 1 host.

    python -m benchmarks.bench_multihost [--steps=20] [--repeats=5] [--rates=none,1gbit,100mbit]

Needs root (network namespaces) and OpenSSH. The hosts are network namespaces on a private
bridge (tfsync_testbed.netns); the link between them is limited with ``tc`` (a ``tbf``
qdisc on each host's interface: this kernel has no netem, so no added delay). Every job is
``horovodrun -np 4 --gloo``: on one host ``-H localhost:4``; across hosts ``-H hostA:2,hostB:2``
over SSH, so that in hybrid mode each host is one group (dense inside, Top-K 1 % across,
``cross_group=periodic`` every 3 steps, ``period`` 3). Each rank trains an MLP of 1.32M parameters on
synthetic data, batch 64; after one warm-up epoch every one of ``--repeats`` epochs of
``--steps`` steps is timed on rank 0, and the table reports the median and the spread of those
epochs' mean step time. The link's measured TCP rate (one stream, 2 s) is reported beside it.
Results go to docs/bench_multihost.json and a section of docs/BENCHMARKS.md.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

from absl import app, flags

from benchmarks.benchlib import DOCS, REPO, bad_flag, module_command, replace_section, repo_env
from benchmarks.linkrate import link_rate
from benchmarks.multihost_report import hybrid_verdicts

HYBRID_KNOBS = ("compression=topk", "topk_ratio=0.01", "cross_group=periodic", "period=3")
flags.DEFINE_integer("steps", 20, "Steps per timed epoch.")
flags.DEFINE_integer("repeats", 5, "Timed epochs per job (after one warm-up epoch).")
flags.DEFINE_integer("jobs", 2, "Jobs per setting and mode (the settings are run in turn, this many rounds).")
flags.DEFINE_list("rates", ["none", "1gbit", "100mbit"], "Link rates between the hosts (none: unlimited).")
flags.DEFINE_list("modes", ["sync", "hybrid"], "Modes to time.")
flags.DEFINE_integer("features", 256, "Input features.")
flags.DEFINE_integer("hidden", 1024, "Hidden units (two hidden layers).")
flags.DEFINE_integer("batch_size", 64, "Per-rank batch size.")
flags.DEFINE_string("worker_out", None, "Internal: set when running as a rank of the job.")
flags.DEFINE_bool("rewrite_docs", False, "Only rewrite the BENCHMARKS.md section from bench_multihost.json.")
flags.DEFINE_string("docs_dir", DOCS, "Where bench_multihost.json and BENCHMARKS.md go.")
flags.DEFINE_list("hybrid_knobs", list(HYBRID_KNOBS), "Hybrid's knobs as KNOB=VALUE (TFSYNC_KNOB in the job's "
                  "environment); the groups are one per host (on one host, group_size=2).")
flags.DEFINE_string("section", "multihost", "The BENCHMARKS.md section (and the JSON's name: bench_SECTION.json).")
FLAGS = flags.FLAGS
BURST = {"1gbit": "512kb", "100mbit": "64kb"}


def worker(out_path: str) -> None:
    import numpy as np
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.keras.compat import keras

    strategy = tfsyncmodes.make_strategy()
    rng = np.random.default_rng(strategy.worker_index)
    x = rng.standard_normal((FLAGS.batch_size * 32, FLAGS.features)).astype("float32")
    y = rng.integers(0, 10, size=len(x)).astype("int32")

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(FLAGS.batch_size, drop_remainder=True)

    class EpochTimes(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append((time.perf_counter() - self.started) / FLAGS.steps)

    times = []
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((FLAGS.features,)),
                                  keras.layers.Dense(FLAGS.hidden, activation="relu"),
                                  keras.layers.Dense(FLAGS.hidden, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.Adam(1e-3), strategy.mode),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    strategy.fit(model, dataset_fn, epochs=1 + FLAGS.repeats, steps_per_epoch=FLAGS.steps, verbose=0,
                 callbacks=[EpochTimes()])
    if strategy.worker_index == 0:
        with open(out_path, "w", encoding="utf-8") as handle:
            layout = getattr(strategy, "layout", None)
            json.dump({"epoch_step_seconds": times[1:], "parameters": int(model.count_params()),
                       "groups": [list(g) for g in layout.groups] if layout else None}, handle)


def run_job(bed, mesh, mode: str, two_hosts: bool, env: dict) -> dict:
    a, b = bed.hosts
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        hosts = ["-H", f"{a.name}:2,{b.name}:2", "--network-interface", "tfs0", *mesh.horovodrun_args()] \
            if two_hosts else ["-H", "localhost:4", "--network-interface", "lo"]
        command = [horovodrun, "-np", "4", *hosts, "--gloo", *module_command("benchmarks.bench_multihost"),
                   f"--worker_out={out}", f"--steps={FLAGS.steps}",
                   f"--repeats={FLAGS.repeats}", f"--features={FLAGS.features}", f"--hidden={FLAGS.hidden}",
                   f"--batch_size={FLAGS.batch_size}"]
        knobs = dict(TFSYNC_MODE=mode)
        if mode == "hybrid":
            knobs.update({f"TFSYNC_{k.upper()}": v for k, v in hybrid_knobs().items()})
            if not two_hosts:  # the same groups as across hosts, where they come from the hosts
                knobs.update(TFSYNC_GROUP_SIZE="2")
        result = a.run(command, timeout=1200, env=dict(env, **knobs), cwd=REPO)
        if result.returncode != 0:
            sys.stderr.write(result.stdout[-3000:] + result.stderr[-5000:])
            sys.exit(f"bench_multihost: the {mode} job failed with status {result.returncode}")
        with open(out, encoding="utf-8") as handle:
            return json.load(handle)


def hybrid_knobs() -> dict:
    """``--hybrid_knobs`` as {knob: value}; one that is not KNOB=VALUE, or sets the mode or the
    groups, is one line and status 2 before any job. A knob or value the library refuses is
    refused by the first hybrid job's own configuration, which names it (in its output)."""
    knobs = {}
    for item in FLAGS.hybrid_knobs:
        key, sep, value = item.partition("=")
        if not sep or not key or key in ("mode", "group_size", "groups"):
            bad_flag("benchmarks.bench_multihost", "hybrid_knobs", f"{item!r} is not KNOB=VALUE of hybrid's exchange",
                     "use e.g. compression=topk_int2 (the mode and the groups are the benchmark's)")
        knobs[key] = value
    return knobs


def summary(times):
    ms = [1000 * t for t in times]
    return {"median_ms": round(statistics.median(ms), 2), "min_ms": round(min(ms), 2), "max_ms": round(max(ms), 2),
            "epochs_ms": [round(v, 2) for v in ms]}


def main(argv):
    del argv
    if FLAGS.worker_out:
        worker(FLAGS.worker_out)
        return
    hybrid_knobs()
    if FLAGS.rewrite_docs:
        with open(os.path.join(FLAGS.docs_dir, f"bench_{FLAGS.section}.json"), encoding="utf-8") as handle:
            write(json.load(handle))
        return
    from tfsync_testbed import netns, ssh

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFSYNC_", "HOROVOD_"))}
    env = repo_env(env, TF_CPP_MIN_LOG_LEVEL="2")
    results = {"rows": []}
    with tempfile.TemporaryDirectory() as work, netns.HostBed(2) as bed, ssh.SshMesh(bed, work) as mesh:
        env = mesh.env(env)
        settings = [("1 host", None)] + [(f"2 hosts, {r}", r) for r in FLAGS.rates]
        epochs = {}
        for round_ in range(FLAGS.jobs):
            for label, rate in settings:
                two_hosts = rate is not None
                bed.shape(rate if rate and rate != "none" else None, burst=BURST.get(rate, "256kb"))
                measured = link_rate(bed) if two_hosts else None
                for mode in FLAGS.modes:
                    print(f"[bench_multihost] round {round_ + 1}: {label}: {mode}", flush=True)
                    out = run_job(bed, mesh, mode, two_hosts, env)
                    results["parameters"] = out["parameters"]
                    entry = epochs.setdefault((label, mode), dict(setting=label, rate=rate, mode=mode,
                                                                  groups=out["groups"], link=[], jobs=[]))
                    entry["jobs"].append(out["epoch_step_seconds"])
                    if measured:
                        entry["link"].append(measured)
                    print(f"[bench_multihost]   {summary(out['epoch_step_seconds'])}", flush=True)
        for entry in epochs.values():
            link, jobs = entry.pop("link"), entry.pop("jobs")
            results["rows"].append(dict(entry, link_mbit_s=round(statistics.median(link) * 8 / 1e6, 1) if link else None,
                                        job_medians_ms=[round(1000 * statistics.median(j), 2) for j in jobs],
                                        **summary([t for j in jobs for t in j])))
    write(results)


def write(results):
    os.makedirs(FLAGS.docs_dir, exist_ok=True)
    results.setdefault("hybrid_knobs", list(FLAGS.hybrid_knobs))
    with open(os.path.join(FLAGS.docs_dir, f"bench_{FLAGS.section}.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    base = {r["mode"]: r["median_ms"] for r in results["rows"] if r["setting"] == "1 host"}
    knobs = results["hybrid_knobs"]
    command = "python -m benchmarks.bench_multihost" + ("" if FLAGS.section == "multihost" else
                                                        f" --section={FLAGS.section} --hybrid_knobs={','.join(knobs)}"
                                                        f" --rates={','.join(FLAGS.rates)} --jobs={FLAGS.jobs}")
    lines = ["## Across hosts: sync and hybrid step time over a rate-limited link"
             + ("" if FLAGS.section == "multihost" else f", hybrid with {', '.join(knobs)}"), "",
             f"`{command}` — horovodrun -np 4 --gloo; across hosts `-H hostA:2,hostB:2` "
             f"over SSH between two network namespaces on one 2-core machine, the link limited with `tc` tbf "
             f"(no delay emulation); MLP of {results['parameters']:,} parameters, batch {FLAGS.batch_size} per rank, "
             f"Adam; hybrid: groups {{0,1}}, {{2,3}} (across hosts: one group per host; on one host "
             f"`group_size=2`), {', '.join(knobs)} (error feedback with any lossy compression). "
             f"Step time: mean over an epoch of {FLAGS.steps} steps, {FLAGS.repeats} epochs after a warm-up one "
             f"in each of {FLAGS.jobs} jobs per row (the settings run in turn, {FLAGS.jobs} rounds); median and "
             "range over all those epochs, and each job's median.", "",
             "| setting | link (measured, Mbit/s) | mode | median step (ms) | range (ms) | per job (ms) | ratio to 1 host |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for r in results["rows"]:
        link = "" if r["link_mbit_s"] is None else f"{r['link_mbit_s']:,.0f}"
        lines.append(f"| {r['setting']} | {link} | {r['mode']} | {r['median_ms']:.1f} | "
                     f"{r['min_ms']:.1f}-{r['max_ms']:.1f} | {', '.join(f'{m:.1f}' for m in r.get('job_medians_ms', []))} | "
                     f"{r['median_ms'] / base[r['mode']]:.2f} |")
    gaps = []
    one = {r["mode"]: r for r in results["rows"] if r["setting"] == "1 host"}
    for rate in FLAGS.rates:
        rows = {r["mode"]: r["median_ms"] for r in results["rows"] if r["rate"] == rate}
        if not ({"sync", "hybrid"} <= set(rows) and {"sync", "hybrid"} <= set(one)):
            continue
        sync_gap, hybrid_gap = rows["sync"] - base["sync"], rows["hybrid"] - base["hybrid"]
        if one["hybrid"]["min_ms"] <= rows["hybrid"] <= one["hybrid"]["max_ms"]:
            hybrid_text = f"hybrid {hybrid_gap:+.1f} ms, inside its one-host range (no measurable gap)"
        else:
            hybrid_text = f"hybrid {hybrid_gap:+.1f} ms ({1 - hybrid_gap / sync_gap:.0%} of sync's gap closed)"
        gaps.append(f"{rate}: sync {sync_gap:+.1f} ms, {hybrid_text}; sync's step over hybrid's on this "
                    f"link {rows['sync'] / rows['hybrid']:.2f}")
    lines += [""] + hybrid_verdicts(results)
    if gaps:
        lines += ["", "Cross-host cost per step (median, the same mode on one host subtracted): " + "; ".join(gaps) + "."]
    lines += ["",
              "Read with care: both hosts share the same 2 cores, so the one-host and two-host jobs do the same "
              "compute on the same cores and differ in the network path only (loopback against a veth pair and "
              "a bridge, and the tbf limit); ranks on one host talk over loopback in either case. Sync mode "
              "here is Horovod's allreduce of dense float32 gradients: the sync-compression knobs are not part "
              "of this measurement."]
    replace_section(os.path.join(FLAGS.docs_dir, "BENCHMARKS.md"), FLAGS.section, "\n".join(lines) + "\n")


if __name__ == "__main__":
    app.run(main)
