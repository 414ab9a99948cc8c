"""The launcher's side of a mode schedule through async: one process layout per phase.

``python -m tfsyncmodes.launch --np 2 --workers 2 --ps 1 -- python scripts/train.py
--sync_mode_schedule=sync:1e,async:1e,sync --epochs=3`` runs phase 0 (sync: ``horovodrun -np 2``
over Gloo on the loopback interface), then phase 1 (async: a local chief/worker/ps cluster),
then phase 2 (sync again), each with ``TFSYNC_MODE`` (the phase's mode), ``TFSYNC_PHASE`` (its
index) and ``TFSYNC_PHASE_DIR`` (the checkpoints) in its environment. A phase that exits 0
has written its checkpoint; the first phase also wrote the plan (``phases.json``), from which
the launcher takes the later phases' modes. A phase that fails, a signal or ``--timeout``
ends the run with that status, and nothing it started is left running.

Like ``tfsyncmodes/launch.py`` this module imports nothing from the package (the launcher
loads it by path), so starting phases does not import TensorFlow.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Optional, Sequence

ENV_PHASE, ENV_DIR, ENV_MODE = "TFSYNC_PHASE", "TFSYNC_PHASE_DIR", "TFSYNC_MODE"
ENV_SCHEDULE = "TFSYNC_MODE_SCHEDULE"
PLAN_FILE = "phases.json"
HOROVOD_MODES = ("sync", "hybrid")
GRACE_SECONDS = 5.0


class BadInput(ValueError):
    """One line for the user; the launcher exits 2."""


def schedule_text(command: Sequence[str], environ=None) -> str:
    """The ``--sync_mode_schedule`` the command gives (else ``TFSYNC_MODE_SCHEDULE``), or ''."""
    environ = os.environ if environ is None else environ
    for position, word in enumerate(command):
        for flag in ("--sync_mode_schedule", "-sync_mode_schedule"):
            if word.startswith(flag + "="):
                return word.split("=", 1)[1]
            if word == flag and position + 1 < len(command):
                return command[position + 1]
    return environ.get(ENV_SCHEDULE, "")


def schedule_modes(text: str) -> List[str]:
    """The modes of a schedule's phases in order (the script validates the text itself)."""
    return [part.partition(":")[0].strip().lower() for part in text.split(",") if part.strip()]


def wants_phases(command: Sequence[str]) -> bool:
    return "async" in schedule_modes(schedule_text(command))


def check(args) -> None:
    """What the launcher can tell about a phased run before starting anything."""
    text = schedule_text(args.command)
    modes = schedule_modes(text)
    if args.ps < 1:
        raise BadInput(f"--ps: {args.ps}, but --sync_mode_schedule {text!r} has an async phase, which needs a "
                       "parameter server; use --ps 1 or more")
    if any(w == "--sync_mode" or w.startswith(("--sync_mode=", "-sync_mode=")) for w in args.command):
        raise BadInput(f"command: --sync_mode with --sync_mode_schedule {text!r}; drop --sync_mode, the "
                       "launcher sets each phase's mode")
    if args.np is not None and args.np < 1:
        raise BadInput(f"--np: {args.np} is too few; use 1 or more")
    legacy = os.environ.get("TF_USE_LEGACY_KERAS")
    if legacy in ("true", "True", "1"):  # as tfsyncmodes.keras.compat reads it, in every task
        raise BadInput(f"TF_USE_LEGACY_KERAS: {legacy}, but --sync_mode_schedule {text!r} has an async phase, "
                       "which runs under Keras 3 only; unset TF_USE_LEGACY_KERAS")
    if any(m in HOROVOD_MODES for m in modes) and not horovodrun_path():
        raise BadInput("horovodrun: not found beside this Python or on PATH; install Horovod "
                       "(scripts/install.sh) for the schedule's sync and hybrid phases")


def horovodrun_path() -> Optional[str]:
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return beside if os.path.exists(beside) else shutil.which("horovodrun")


def horovodrun_command(ranks: int, command: Sequence[str]) -> List[str]:
    """``horovodrun -np N`` on this host over Gloo and the loopback interface, inside the
    launcher's namespace. Where the ranks' program is a Python, Horovod's launcher runs under
    that interpreter (``python -m horovod.runner.launch``, what the ``horovodrun`` script runs),
    so it is the Horovod the ranks import."""
    python = bool(command) and re.fullmatch(r"(.*[-_])?python[\d.]*", os.path.basename(command[0])) is not None
    launcher = [command[0], "-m", "horovod.runner.launch"] if python else [horovodrun_path() or "horovodrun"]
    return [*launcher, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo",
            "--network-interface", "lo", *command]


class PhaseRunner:
    """Runs the phases one after the other; `start_cluster()` runs one async phase on a local
    TF_CONFIG cluster (the launcher's own) with the environment set here."""

    def __init__(self, args, start_cluster: Callable[[], int], say: Callable[[str], None]):
        self.args = args
        self.start_cluster = start_cluster
        self.say = say
        self.stop_reason: Optional[str] = None
        self.timeout = args.timeout
        self.deadline = time.monotonic() + args.timeout if args.timeout else None

    def run(self) -> int:
        text = schedule_text(self.args.command)
        keep = bool(self.args.phase_dir)
        directory = os.path.abspath(self.args.phase_dir) if keep else tempfile.mkdtemp(prefix="tfsync-phases-")
        os.makedirs(directory, exist_ok=True)
        saved = {k: os.environ.get(k) for k in (ENV_PHASE, ENV_DIR, ENV_MODE)}
        try:
            index, modes = 0, [schedule_modes(text)[0]]
            while index < len(modes):
                for signum in (signal.SIGINT, signal.SIGTERM):  # between phases too
                    signal.signal(signum, self._on_signal)
                if self.stop_reason:
                    self.say(f"{self.stop_reason}; stopping before phase {index}")
                    return 124 if self.stop_reason == "timeout" else 130
                # phase 0's count is the text's; the plan phase 0 writes gives the rest theirs
                status = self._phase(index, modes[index], len(modes) if index else len(schedule_modes(text)),
                                     directory)
                if status != 0:
                    self.say(f"phase {index} ({modes[index]}) ended with status {status}; stopping")
                    return status
                plan = _read(os.path.join(directory, PLAN_FILE))
                if plan is None or not os.path.isfile(os.path.join(directory, f"phase-{index}.npz")):
                    self.say(f"phase {index} exited 0 but wrote no plan or checkpoint in {directory}")
                    return 1
                modes = [p["mode"] for p in plan["phases"]]
                index += 1
            self.say(f"all {len(modes)} phases done ({text})")
            return 0
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if not keep:
                shutil.rmtree(directory, ignore_errors=True)

    def _phase(self, index: int, mode: str, count: int, directory: str) -> int:
        os.environ.update({ENV_PHASE: str(index), ENV_DIR: directory, ENV_MODE: mode})
        of = f" (phases 0-{count - 1})"
        if mode in HOROVOD_MODES:
            ranks = self.args.np or self.args.workers
            self.say(f"phase {index}{of}: {mode} on horovodrun -np {ranks}")
            return self._horovodrun(ranks)
        self.say(f"phase {index}{of}: {mode} on a cluster of {self.args.workers} worker(s) and "
                 f"{self.args.ps} ps")
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.stop_reason = "timeout"
                return 124
            self.args.timeout = left
        return self.start_cluster()

    def _horovodrun(self, ranks: int) -> int:
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        env["PYTHONUNBUFFERED"] = "1"
        process = subprocess.Popen(horovodrun_command(ranks, self.args.command), env=env,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            while process.poll() is None:
                if self.stop_reason:
                    self.say(f"{self.stop_reason}; stopping horovodrun")
                    break
                if self.deadline is not None and time.monotonic() > self.deadline:
                    self.say(f"timeout after {self.timeout:g}s; stopping horovodrun")
                    self.stop_reason = "timeout"
                    break
                time.sleep(0.1)
        finally:
            _stop(process)
        if self.stop_reason:
            return 124 if self.stop_reason == "timeout" else 130
        return process.returncode

    def _on_signal(self, signum, frame) -> None:
        del frame
        self.stop_reason = signal.Signals(signum).name


def run(args, launcher_class, private: bool) -> int:
    """Runs the phases; async phases on `launcher_class(args)`'s local cluster."""
    say = launcher_class(args).say
    if private:
        say("network: a namespace of its own with loopback only; nothing listens beyond it")
    return PhaseRunner(args, lambda: launcher_class(args).run(), say).run()


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process group (horovodrun stops its ranks), then SIGKILL; waits."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is None:
            _signal_group(process, signum)
            try:
                process.wait(timeout=GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                pass
    _signal_group(process, signal.SIGKILL)  # whatever it started and left behind
    process.wait()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _read(path: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None
