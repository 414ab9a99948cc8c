"""The modes compared, measured: speed, convergence, fault tolerance and communication of every
mode the package accepts, on one model, data and number of samples, in a table and two plots.

    python -m benchmarks.compare_modes        # all modes, 2 workers, digits (~12 min on 2 cores)
    python -m benchmarks.compare_modes --model=my_models:build --data=my_data:load --epochs=20

Every run is ``scripts/train.py`` on a local cluster started by the project's launchers
(``horovodrun`` for the Horovod modes, ``python -m tfsyncmodes.launch`` for async), under
three conditions:

  equal  all workers alike;
  slow   worker 1 slowed --slow_factor times (``--sync_slow_worker=1:FACTOR``);
  kill   worker 1 killed (SIGKILL) once the chief has logged half the epochs; a run that
         stopped is started again with the same --model_dir, to see whether it resumes;
  kill_ps  (modes on a ps cluster) the parameter server killed the same way;

and, with ``--compute_ms`` > 0, "emulated" equal and slow runs in which every step also waits
that long per --batch_size samples (a sleep holding no core, standing for a large model's
compute, the same per sample in every mode; the slow worker waits FACTOR times as long), so that the workers do not compete for the cores and throughput
ratios measure what the mode itself costs. For async, one worker alone (and alone slowed)
gives the sum of the individual rates that the target compares against.

The modes come from the package (``tfsyncmodes.config``), not from a list here; hybrid
policies (``--sweep=compression,cross_group``) and any other variant (``--variant``) add
columns. Raw results: docs/compare_modes.json; table: stdout and docs/BENCHMARKS.md; plots:
docs/compare_modes_loss.png, docs/compare_modes_speed.png (``pip install .[bench]``).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from absl import flags

from benchmarks import compare_report, compare_table, comparelib
from benchmarks.benchlib import DOCS
flags.DEFINE_integer("workers", 2, "Workers (Horovod ranks, or async worker tasks) in every run.")
flags.DEFINE_integer("epochs", 10, "Epochs of every run (the same samples in every mode).")
flags.DEFINE_integer("batch_size", 64, "Samples per step: the global batch of a sync/hybrid step, "
                     "one async worker's batch.")
flags.DEFINE_enum("dataset", "digits", ["digits", "synthetic"], "scripts/train.py --dataset.")
flags.DEFINE_string("model", None, "module:function building your own Keras model (scripts/train.py --model).")
flags.DEFINE_string("data", None, "module:function returning your own data (scripts/train.py --data).")
flags.DEFINE_list("train_flags", [], "More scripts/train.py flags for every run, e.g. --hidden_units=256.")
flags.DEFINE_list("modes", [], "Modes to compare (default: every mode the package accepts).")
flags.DEFINE_list("conditions", ["equal", "slow", "kill", "kill_ps"],
                  "Conditions for the modes: equal, slow, kill, kill_ps (only modes on a ps cluster).")
flags.DEFINE_float("slow_factor", 4.0, "How many times slower the slow worker runs.")
flags.DEFINE_float("compute_ms", 50.0, "Emulated compute of a step on --batch_size samples in the emulated "
                   "runs (a worker with part of the batch waits that part; 0: no emulated runs).")
flags.DEFINE_integer("emulated_epochs", 4, "Epochs of the emulated runs (they measure speed; 0: --epochs).")
flags.DEFINE_list("emulated_conditions", ["equal", "slow"], "Conditions of the emulated runs.")
flags.DEFINE_list("sweep", [],
                  "Hybrid knobs whose every accepted value (besides the default) becomes a column, "
                  "e.g. compression,cross_group.")
flags.DEFINE_multi_string("variant", [], "A column of your own: LABEL=MODE:FLAG=VALUE,FLAG=VALUE "
                          "(train.py flags without dashes; no '=' in LABEL), e.g. "
                          "'hybrid-s8=hybrid:staleness=8,cross_group=stale'. Repeat for more.")
flags.DEFINE_list("variant_conditions", ["equal"], "Conditions of the sweep and --variant columns.")
flags.DEFINE_list("launcher", [], "MODE:ps or MODE:horovod for modes the script does not know "
                  "(default: async on a ps cluster, every other mode under horovodrun).")
flags.DEFINE_integer("group_size", 0, "Hybrid --sync_group_size (0: workers / 2, at least 1).")
flags.DEFINE_float("target_loss", None, "Loss for 'time to target' (default: the largest final "
                   "training loss of the equal-condition runs of the modes, so that each reaches it).")
flags.DEFINE_integer("repeats", 1, "Runs of each equal and slow condition (throughput: median, range).")
flags.DEFINE_bool("rerun_after_kill", True, "Start a stopped kill run again to see whether it resumes.")
flags.DEFINE_integer("intra_op_threads", 1, "TF_NUM_INTRAOP_THREADS of every process (0: TensorFlow's "
                     "default, one per core), so that the processes of a job do not fight over the cores.")
flags.DEFINE_string("python", None, "The interpreter of every job's processes (default: the one running this).")
flags.DEFINE_float("timeout", 420.0, "Seconds one job may take before it is killed.")
flags.DEFINE_string("docs_dir", DOCS, "Where the JSON, BENCHMARKS.md and PNGs go.")
flags.DEFINE_string("json_name", "compare_modes.json", "File name of the raw results in --docs_dir.")
flags.DEFINE_bool("write_docs", True, "Write the table into --docs_dir/BENCHMARKS.md.")
flags.DEFINE_bool("report_only", False, "Rebuild table and plots from the JSON, running nothing.")
flags.DEFINE_bool("dry_run", False, "Print the planned runs and exit.")
flags.DEFINE_string("work_dir", None, "Keep the runs' model dirs and logs here (default: a temp dir).")
FLAGS = flags.FLAGS


def columns() -> list:
    """(label, mode, train.py flags) of every column: the modes, then sweeps and variants."""
    from tfsyncmodes.errors import ConfigError

    accepted = comparelib.accepted_values("mode")
    modes = FLAGS.modes or accepted
    for mode in modes:
        if mode not in accepted:
            raise ConfigError("flag", "--modes", f"{mode!r} is not a mode", f"use some of {', '.join(accepted)}")
    group = FLAGS.group_size or max(1, FLAGS.workers // 2)
    per_mode = {"hybrid": [f"--sync_group_size={group}"]}
    cols = [(mode, mode, per_mode.get(mode, [])) for mode in modes]
    from tfsyncmodes import config

    for key in FLAGS.sweep:
        if key not in config.KNOBS_BY_KEY:
            raise ConfigError("flag", "--sweep", f"{key!r} is not a knob", "use e.g. compression,cross_group")
        knob = config.KNOBS_BY_KEY[key]
        for value in comparelib.accepted_values(key):
            if value != knob.default and "hybrid" in modes:
                cols.append((f"hybrid {key}={value}", "hybrid", per_mode["hybrid"] + [f"--{knob.flag}={value}"]))
    for spec in FLAGS.variant:
        label, sep, rest = spec.partition("=")
        mode, _, settings = rest.partition(":")
        if not sep or mode not in accepted:
            raise ConfigError("flag", "--variant", f"{spec!r} is not LABEL=MODE:FLAG=VALUE,...",
                              f"use e.g. 'hybrid s8=hybrid:staleness=8' with MODE one of {', '.join(accepted)}")
        extra = [f"--{s if s.startswith('sync_') else 'sync_' + s}" for s in map(str.strip, settings.split(",")) if s]
        cols.append((label, mode, per_mode.get(mode, []) + extra))
    return cols


def plan() -> list:
    """Every run, in order: dicts with column, mode, condition, emulated and the flags."""
    from tfsyncmodes.errors import ConfigError

    launchers = {}
    for spec in FLAGS.launcher:
        mode, _, kind = spec.partition(":")
        if kind not in ("ps", "horovod"):
            raise ConfigError("flag", "--launcher", f"{spec!r} is not MODE:ps or MODE:horovod", "e.g. async:ps")
        launchers[mode] = kind
    for name, allowed in (("conditions", ("equal", "slow", "kill", "kill_ps")),
                          ("emulated_conditions", ("equal", "slow")),
                          ("variant_conditions", ("equal", "slow", "kill", "kill_ps"))):
        for condition in getattr(FLAGS, name):
            if condition not in allowed:
                raise ConfigError("flag", f"--{name}", f"{condition!r} is not a condition", f"use {', '.join(allowed)}")
    if FLAGS.workers < 2:
        raise ConfigError("flag", "--workers", f"{FLAGS.workers} is too few", "use at least 2 (worker 1 is slowed or killed)")
    cols = columns()
    main = {c[0] for c in cols if c[0] == c[1]}
    base = [f"--epochs={FLAGS.epochs}", f"--batch_size={FLAGS.batch_size}", f"--dataset={FLAGS.dataset}"]
    base += [f"--model={FLAGS.model}"] if FLAGS.model else []
    base += [f"--data={FLAGS.data}"] if FLAGS.data else []
    base += list(FLAGS.train_flags)
    slow = f"{FLAGS.slow_factor:g}"
    runs = []

    def add(label, mode, extra, condition, emulated, workers=FLAGS.workers, repeat=0):
        flags_ = base + extra
        if emulated:
            epochs = FLAGS.emulated_epochs or FLAGS.epochs
            flags_ = [f"--epochs={epochs}" if f.startswith("--epochs=") else f for f in flags_]
            flags_ += [f"--compute_ms={FLAGS.compute_ms:g}"]
            if condition in ("slow", "solo slow"):
                flags_ += [f"--compute_slow_worker={1 if condition == 'slow' else 0}:{slow}"]
        elif condition in ("slow", "solo slow"):
            flags_ += [f"--sync_slow_worker={1 if condition == 'slow' else 0}:{slow}"]
        runs.append({"column": label, "mode": mode, "condition": condition, "emulated": emulated,
                     "workers": workers, "repeat": repeat, "flags": flags_,
                     "on_ps": comparelib.uses_parameter_servers(mode, launchers)})

    variants = [(FLAGS.conditions, False)]
    if FLAGS.compute_ms > 0:
        variants.append((FLAGS.emulated_conditions, True))
    for conditions, emulated in variants:
        for condition in conditions:
            for label, mode, extra in cols:
                if label not in main and (emulated or condition not in FLAGS.variant_conditions):
                    continue
                if condition == "kill_ps" and not comparelib.uses_parameter_servers(mode, launchers):
                    continue
                for repeat in range(FLAGS.repeats if not condition.startswith("kill") else 1):
                    add(label, mode, extra, condition, emulated, repeat=repeat)
        # The individual rates of async-like modes: one worker alone, and alone slowed.
        for label, mode, extra in cols:
            if label in main and runs and comparelib.uses_parameter_servers(mode, launchers) \
                    and ("slow" in conditions):
                add(label, mode, extra, "solo", emulated, workers=1)
                add(label, mode, extra, "solo slow", emulated, workers=1)
    return runs


def execute(runs: list, work_dir: str) -> list:
    """Runs every job, printing a progress line with an estimate of the time left."""
    started = time.perf_counter()
    done_seconds = []
    for number, run in enumerate(runs, 1):
        name = f"{run['column']} / {'emulated ' if run['emulated'] else ''}{run['condition']}"
        model_dir = os.path.join(work_dir, f"run{number:02d}")
        kill = run["condition"].startswith("kill")
        job = comparelib.run_job(run["mode"], workers=run["workers"], train_flags=run["flags"], model_dir=model_dir,
                                 on_ps=run["on_ps"], timeout=FLAGS.timeout,
                                 kill_after_epochs=max(1, FLAGS.epochs // 2) if kill else None,
                                 kill_role="ps" if run["condition"] == "kill_ps" else "worker",
                                 intra_op_threads=FLAGS.intra_op_threads, python=FLAGS.python)
        run.update(job)
        if kill and job["returncode"] != 0 and FLAGS.rerun_after_kill:
            rerun = comparelib.run_job(run["mode"], workers=run["workers"], train_flags=run["flags"],
                                       model_dir=model_dir, on_ps=run["on_ps"], timeout=FLAGS.timeout,
                                       log_path=os.path.join(model_dir, "rerun.log"),
                                       intra_op_threads=FLAGS.intra_op_threads, python=FLAGS.python)
            run["rerun"] = {k: rerun[k] for k in ("wall_seconds", "returncode", "metrics", "curve", "error",
                                                  "started_unix") if k in rerun}
        done_seconds.append(time.perf_counter() - started - sum(done_seconds))
        left = (len(runs) - number) * (sum(done_seconds) / len(done_seconds))
        outcome = compare_report.one_line(run)
        print(f"[{number}/{len(runs)}] {name}: {outcome}; {time.perf_counter() - started:.0f} s so far, "
              f"about {left / 60:.1f} min left (load average {os.getloadavg()[0]:.1f})", flush=True)
    return runs


def main(argv):
    del argv
    json_path = os.path.join(FLAGS.docs_dir, FLAGS.json_name)
    if FLAGS.report_only:
        with open(json_path, encoding="utf-8") as handle:
            result = json.load(handle)
    else:
        runs = plan()
        if FLAGS.dry_run:
            for number, run in enumerate(runs, 1):
                launcher = "ps cluster" if run["on_ps"] else "horovodrun"
                print(f"[{number}/{len(runs)}] {run['column']} / {'emulated ' if run['emulated'] else ''}"
                      f"{run['condition']}: {run['mode']} on a {launcher} of {run['workers']}: {' '.join(run['flags'])}")
            return
        work_dir = FLAGS.work_dir or tempfile.mkdtemp(prefix="compare_modes-")
        print(f"compare_modes: {len(runs)} runs, {FLAGS.workers} workers, {FLAGS.epochs} epochs; "
              f"run logs in {work_dir}", flush=True)
        load_before = os.getloadavg()
        started = time.perf_counter()
        try:
            execute(runs, work_dir)
        finally:
            if not FLAGS.work_dir:
                shutil.rmtree(work_dir, ignore_errors=True)
        result = {
            "settings": {"workers": FLAGS.workers, "epochs": FLAGS.epochs, "batch_size": FLAGS.batch_size,
                         "dataset": FLAGS.dataset, "model": FLAGS.model, "data": FLAGS.data,
                         "train_flags": list(FLAGS.train_flags), "slow_factor": FLAGS.slow_factor,
                         "compute_ms": FLAGS.compute_ms, "intra_op_threads": FLAGS.intra_op_threads,
                         "emulated_epochs": FLAGS.emulated_epochs or FLAGS.epochs,
                         "target_loss": FLAGS.target_loss,
                         "kill_after_epochs": max(1, FLAGS.epochs // 2)},
            "machine": {"cores": os.cpu_count(), "load_average_before": [round(v, 2) for v in load_before],
                        "load_average_after": [round(v, 2) for v in os.getloadavg()],
                        "total_seconds": round(time.perf_counter() - started, 1),
                        "date": time.strftime("%Y-%m-%d", time.gmtime())},
            "runs": runs,
        }
        os.makedirs(FLAGS.docs_dir, exist_ok=True)
    result["summary"] = compare_report.summarize(result)
    with open(json_path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    text = compare_table.markdown(result)
    print(text)
    if FLAGS.write_docs:
        from benchmarks.benchlib import replace_section

        replace_section(os.path.join(FLAGS.docs_dir, "BENCHMARKS.md"), "compare_modes", text)
    for path in compare_table.plots(result, FLAGS.docs_dir):
        print(f"wrote {path}")


if __name__ == "__main__":
    import tfsyncmodes

    tfsyncmodes.run(main)
