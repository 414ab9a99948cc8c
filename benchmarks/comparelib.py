"""Running one training job of ``benchmarks/compare_modes.py`` and reading what it left behind.

A job is ``scripts/train.py`` on a local cluster started by the project's own launchers:
``horovodrun`` (loopback only, :mod:`tfsync_testbed.localrun`) for the modes that run as
Horovod ranks, ``python -m tfsyncmodes.launch`` (chief, ps, workers on 127.0.0.1) for async.
A job can have one worker killed midway: once the chief has logged `kill_after_epochs` epochs
to TensorBoard, the process of Horovod rank 1 (or async task worker:1, or with
``kill_role="ps"`` task ps:0) gets SIGKILL.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Dict, List, Optional, Sequence

from benchmarks.benchlib import REPO, TRAIN, repo_env


def accepted_values(key: str) -> List[str]:
    """The values the package accepts for knob `key` (mode, compression, cross_group): the
    names registered in :mod:`tfsyncmodes.registry`, as the knob's parser reads them. Every value
    is checked with the knob's own parser.
    """
    from tfsyncmodes import config

    knob = config.KNOBS_BY_KEY[key]
    choices = getattr(knob.parse, "choices", None)
    if choices is None:
        raise RuntimeError(f"knob {key!r} takes no fixed set of values")
    choices = choices() if callable(choices) else choices
    values = [str(v) for v in choices]
    for value in values:
        knob.parse(value)  # raises if the package no longer takes it
    if not values:
        raise RuntimeError(f"cannot find the accepted values of knob {key!r} in tfsyncmodes.config")
    return values


def uses_parameter_servers(mode: str, overrides: Dict[str, str]) -> bool:
    """Whether `mode` runs on a chief/worker/ps cluster (else: as Horovod ranks)."""
    return overrides.get(mode, "ps" if mode == "async" else "horovod") == "ps"


def command(mode: str, workers: int, train_flags: Sequence[str], model_dir: str, metrics: str,
            on_ps: bool, timeout: float, tolerate_loss: bool, python: Optional[str] = None) -> List[str]:
    """The job's command; `python` (default: this interpreter) runs its processes."""
    python = python or sys.executable
    train = [python, TRAIN, f"--sync_mode={mode}", f"--model_dir={model_dir}",
             f"--metrics_file={metrics}", *train_flags]
    if on_ps:
        return [python, "-m", "tfsyncmodes.launch", "--workers", str(workers), "--ps", "1",
                "--timeout", str(int(timeout)), *(["--tolerate_worker_loss"] if tolerate_loss else []),
                "--", *train]
    from tfsync_testbed import localrun

    return localrun.horovodrun_command(workers, train)


def read_curve(model_dir: str, since: float = 0.0) -> List[Dict[str, float]]:
    """Per-epoch scalars the chief's TensorBoard callback wrote under `model_dir` (event files
    modified after `since`): one dict per epoch with ``epoch``, ``wall_time`` and the logs
    (``loss``, ``accuracy``, ``bytes_sent``, ``staleness_mean``, ...); first, as epoch -1, the
    time training began (when the callback logged the model), if it did."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    epochs: Dict[int, Dict[str, float]] = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "**", "events.out.tfevents.*"), recursive=True)):
        if os.path.getmtime(path) < since or os.sep + "validation" + os.sep in path:
            continue
        try:
            for event in EventFileLoader(path).Load():
                for value in event.summary.value:
                    if value.tag == "keras":  # the model, logged when training begins
                        row = epochs.setdefault(-1, {"epoch": -1, "wall_time": float(event.wall_time)})
                        row["wall_time"] = min(row["wall_time"], float(event.wall_time))
                    if not value.tag.startswith("epoch_"):
                        continue
                    number = (float(tensor_util.make_ndarray(value.tensor)) if value.HasField("tensor")
                              else float(value.simple_value))
                    row = epochs.setdefault(int(event.step), {"epoch": int(event.step)})
                    row[value.tag[len("epoch_"):]] = number
                    row["wall_time"] = max(row.get("wall_time", 0.0), float(event.wall_time))
        except Exception:  # a record being written: what was read so far stands
            continue
    return [epochs[k] for k in sorted(epochs)]


JOB_MARK = "TFSYNC_COMPARE_JOB"  # in the environment of every process a job starts


def _find_victim(job: str, on_ps: bool, role: str = "worker") -> Optional[int]:
    """The pid of Horovod rank 1 / async task worker:1 (`role` "ps": task ps:0) among the
    processes whose environment carries ``JOB_MARK=job`` (found by their mark, not as
    descendants: an interpreter may run a program in a process of its own)."""
    import psutil

    for process in psutil.process_iter():
        try:
            env = process.environ()
        except (psutil.Error, OSError):
            continue
        if env.get(JOB_MARK) != job:
            continue
        if on_ps:
            try:
                task = json.loads(env.get("TF_CONFIG", "{}")).get("task", {})
            except ValueError:
                continue
            if task.get("type") == role and int(task.get("index", -1)) == (1 if role == "worker" else 0):
                return process.pid
        elif env.get("HOROVOD_RANK") == "1" and any("train.py" in part for part in process.cmdline()):
            return process.pid
    return None


def _last_error(text: str) -> str:
    """The most telling error line of a failed job's output (the package's one-line error if
    there is one), without progress-bar noise, shortened."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for marker in ("tfsyncmodes: error", "Error:", "error:", "Error", "error"):
        found = [line[line.index(marker):] if marker == "tfsyncmodes: error" else line
                 for line in lines if marker in line and "WARNING" not in line]
        if found:
            line = found[-1]
            return line if len(line) <= 240 else line[:237] + "..."
    return lines[-1][:240] if lines else ""


def run_job(mode: str, *, workers: int, train_flags: Sequence[str], model_dir: str, on_ps: bool,
            timeout: float, kill_after_epochs: Optional[int] = None, kill_role: str = "worker",
            log_path: Optional[str] = None, intra_op_threads: int = 1, python: Optional[str] = None) -> dict:
    """Runs one job and returns what happened: ``returncode``, ``wall_seconds``, the chief's
    final metrics (``metrics``, None if it wrote none), the per-epoch ``curve``, and for a kill
    ``killed_at_seconds`` / ``killed_after_epoch`` / ``error`` (last error line)."""
    from tfsync_testbed import localrun

    os.makedirs(model_dir, exist_ok=True)
    metrics_path = os.path.join(model_dir, f"metrics-{time.time_ns()}.json")
    cmd = command(mode, workers, train_flags, model_dir, metrics_path, on_ps, timeout,
                  tolerate_loss=kill_after_epochs is not None, python=python)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFSYNC_")}
    job = uuid.uuid4().hex
    env = repo_env(env, TF_CPP_MIN_LOG_LEVEL="2", **{JOB_MARK: job})
    if intra_op_threads:  # keeps the processes of a job from fighting over few cores
        env["TF_NUM_INTRAOP_THREADS"] = str(intra_op_threads)
    log_path = log_path or os.path.join(model_dir, "job.log")
    started_wall = time.time()
    started = time.perf_counter()
    shown = [os.path.relpath(c, REPO) if c.startswith(REPO) else c for c in cmd[-len(train_flags) - 4:]]
    result = {"started_unix": started_wall,
              "command": [c.replace(metrics_path, "METRICS_FILE").replace(model_dir, "MODEL_DIR") for c in shown]}
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=os.getcwd(),
                                   start_new_session=True, text=True)
        try:
            deadline = started + timeout
            while process.poll() is None and time.perf_counter() < deadline:
                if kill_after_epochs is not None and "killed_at_seconds" not in result:
                    done = read_curve(model_dir, since=started_wall - 1)
                    if len([row for row in done if row["epoch"] >= 0]) >= kill_after_epochs:
                        victim = _find_victim(job, on_ps, kill_role)
                        if victim is not None:
                            os.kill(victim, signal.SIGKILL)
                            result.update(killed_at_seconds=round(time.perf_counter() - started, 2),
                                          killed_after_epoch=max(row["epoch"] for row in done) + 1,
                                          killed_pid=victim)
                # A kill still due watches closely: a short job's last epoch can take a fifth of a second.
                time.sleep(0.02 if kill_after_epochs is not None and "killed_at_seconds" not in result else 0.25)
            if process.poll() is None:
                localrun.kill_group(process, signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    pass
                result["timed_out"] = True
        finally:
            localrun.kill_group(process)
            process.wait()
    result["wall_seconds"] = round(time.perf_counter() - started, 2)
    result["returncode"] = process.returncode
    with open(log_path, encoding="utf-8", errors="replace") as log:
        output = log.read()
    if process.returncode != 0:
        result["error"] = _last_error(output)
    result["metrics"] = None
    if os.path.exists(metrics_path):
        with open(metrics_path, encoding="utf-8") as handle:
            result["metrics"] = json.load(handle)
        os.remove(metrics_path)
    result["curve"] = read_curve(model_dir, since=started_wall - 1)
    return result
