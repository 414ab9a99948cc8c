"""Running local multi-process jobs safely: loopback only, bounded in time, nothing left behind.

Used by the tests and the benchmarks. ``horovodrun``'s rendezvous server binds every
interface; where the machine allows it (root, ``unshare``), jobs run in a network namespace of
their own that has only a loopback interface, so nothing listens beyond 127.0.0.1.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import Mapping, Optional, Sequence


# A program named like an interpreter (python, python3.11, warm-python) runs Python: the rule of
# tfsyncmodes/switching/phases/launching.py, which is not imported here (the package would
# import TensorFlow).
PYTHON_NAME = re.compile(r"(.*[-_])?python[\d.]*")


@functools.lru_cache(maxsize=1)
def loopback_namespace_prefix() -> tuple:
    """A command prefix that runs its command in a new loopback-only network namespace, or ()
    where namespaces cannot be created here."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return ()
    prefix = ("unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh")
    try:
        subprocess.run(prefix + ("true",), check=True, timeout=10,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return ()
    return prefix


def horovodrun(python: Optional[str] = None) -> list:
    """The words that start Horovod's launcher: ``PYTHON -m horovod.runner.launch`` (what the
    ``horovodrun`` script runs) under `python`, else the ``horovodrun`` script beside this
    interpreter. Before it starts the ranks, the launcher checks in a forked process that
    Horovod was built with Gloo by importing ``horovod.tensorflow``, TensorFlow with it: about
    6 s of CPU from a cold interpreter, none from one that has TensorFlow imported already."""
    if python is not None:
        return [python, "-m", "horovod.runner.launch"]
    script = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.exists(script):
        script = shutil.which("horovodrun") or "horovodrun"
    return [script]


def horovodrun_command(num_proc: int, command: Sequence[str], extra: Sequence[str] = ()) -> list:
    """``horovodrun -np N`` on localhost over Gloo and the loopback interface. Where the ranks'
    program is a Python (``command[0]``), the launcher runs under that interpreter too."""
    python = command[0] if PYTHON_NAME.fullmatch(os.path.basename(command[0])) else None
    return list(loopback_namespace_prefix()) + [
        *horovodrun(python), "-np", str(num_proc), "-H", f"localhost:{num_proc}", "--gloo",
        "--network-interface", "lo", *extra, *command]


def run(command: Sequence[str], *, timeout: float, env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None, input: Optional[str] = None) -> subprocess.CompletedProcess:
    """Runs `command` in its own process group (`input`, if given, on its stdin); on timeout the
    whole group is killed and ``subprocess.TimeoutExpired`` is raised with the output so far."""
    process = subprocess.Popen(list(command), env=dict(env) if env is not None else None, cwd=cwd,
                               stdin=subprocess.PIPE if input is not None else None,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first, so that a launcher can tear down the tasks it started.
        kill_group(process, signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            kill_group(process)
            stdout, stderr = process.communicate()
        raise subprocess.TimeoutExpired(process.args, timeout, output=stdout, stderr=stderr) from None
    finally:
        kill_group(process)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def kill_group(process: subprocess.Popen, signum: int = signal.SIGKILL) -> None:
    """Signals `process`'s process group (its children included), if any of it is still there."""
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
