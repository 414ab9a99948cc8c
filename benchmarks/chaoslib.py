"""Chaos runs: a 4-rank job (``benchmarks/chaos_worker.py``) that loses a random non-chief
process every ``interval`` seconds (seeded, uniform in [low, high]) and gets it back, and what
it cost (``python -m benchmarks.chaos``; ``tests/test_chaos.py`` imports this module).

- sync: ``horovodrun --gloo`` elastic (``--min-np 2 --max-np 4``, ``--sync_elastic``) over a
  discovery script that names this machine once per rank (four names of 127.0.0.1, one slot
  each); the driver kills a rank other than 0 (SIGKILL), Horovod blacklists that name for
  ``--blacklist-cooldown-range`` seconds and then takes it back (a new process joins at the
  next commit and receives rank 0's state).
- hybrid: the same job as sync with ``--sync_mode=hybrid``: one group per host name (a rank
  each), periodic averaging every ``commit / 2`` steps, commits at round boundaries.
- async: ``python -m tfsyncmodes.launch --workers 4 --ps 1 --max_restarts N``; the driver kills
  a worker task, which the launcher starts again at its address.

From the step log (one line per step after its update: start, end, step count) come:

- counted steps: in sync and hybrid the last record of each step count (a step done again
  after a rollback replaces the one rolled back); in async every record (a lost worker's step that never ended
  wrote none, and the coordinator runs it elsewhere);
- the training's wall time W: from the first counted step's start to the last one's end
  (process start-up, identical with or without failures, is reported apart);
- the pace p: the median, over windows of ``WINDOW`` consecutive counted step ends, of the
  window's length over ``WINDOW`` (the job's undisturbed time per step: most windows hold no
  failure);
- goodput = min(1, counted x p / W): the share of the wall time the counted steps take at the
  undisturbed pace (rolled-back steps, detection, re-forming, re-tracing, a missing worker's
  lost throughput all lower it);
- recovery time of a failure: from the kill to the end of the next counted step.
"""
from __future__ import annotations

import os
import re
import socket
import stat
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from tfsync_testbed import localrun

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("sync", "hybrid", "async")
ELASTIC = ("sync", "hybrid")  # under elastic horovodrun, rolled back to the last commit
WINDOW = 8
RUN_MARK = "TFSYNC_CHAOS_RUN"  # in every process a run starts, to find any left behind
WORKERS = 4


def loopback_names(count: int) -> List[str]:
    """`count` names of 127.0.0.1 (Horovod blacklists a failed rank's host by name, so each
    rank needs a name of its own); resolution is case-blind, Horovod's bookkeeping is not."""
    found = []
    for name in ("localhost", "127.0.0.1", socket.gethostname(), "LOCALHOST", "Localhost", "localHost"):
        try:
            if socket.gethostbyname(name) == "127.0.0.1" and name not in found:
                found.append(name)
        except OSError:
            continue
    if len(found) < count:
        raise RuntimeError(f"only {len(found)} names of 127.0.0.1 here ({found}); need {count}")
    return found[:count]


def command(mode: str, work: str, epochs: int, steps_per_epoch: int, step_ms: float,
            kills: int, python: str = sys.executable, warm: bool = False) -> List[str]:
    """The job's command; `python` is the interpreter of its processes (and of Horovod's
    launcher: ``localrun.horovodrun``); `warm`: sync's and hybrid's ranks start through
    ``python -m tfsyncmodes_warm`` (forked from a server that imported TensorFlow once)."""
    warm_prefix = ["-m", "tfsyncmodes_warm"] if warm and mode != "async" else []
    worker = [python, *warm_prefix, "-m", "benchmarks.chaos_worker", f"--out={work}", f"--epochs={epochs}",
              f"--steps_per_epoch={steps_per_epoch}", f"--step_ms={step_ms}"]
    if mode == "async":
        return [python, "-m", "tfsyncmodes.launch", "--workers", str(WORKERS), "--ps", "1",
                "--max_restarts", str(max(kills, 1)), "--", *worker, "--learning_rate=0.3"]
    hosts = os.path.join(work, "hosts")
    with open(hosts, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{name}:1\n" for name in loopback_names(WORKERS)))
    script = os.path.join(work, "discover.sh")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(f"#!/bin/sh\ncat {hosts}\n")
    os.chmod(script, os.stat(script).st_mode | stat.S_IXUSR)
    return list(localrun.loopback_namespace_prefix()) + [
        *localrun.horovodrun(python), "--gloo", "--network-interface", "lo", "-np", str(WORKERS), "--min-np", "2",
        "--max-np", str(WORKERS), "--host-discovery-script", script,
        "--blacklist-cooldown-range", "1", "4", *worker]


def environment(mode: str, run_id: str, commit: int, collective_timeout: float = 5,
                knobs: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The job's environment; `knobs` ({key: value}) as ``TFSYNC_KEY=value`` on top."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TFSYNC_", "HOROVOD_", "OMPI_", "PMI_")) and k != "TF_CONFIG"}
    env.update(PYTHONPATH=os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p),
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               GRPC_FAIL_FAST="use_caller", TFSYNC_MODE=mode)
    env[RUN_MARK] = run_id
    # Sync under Keras 3; async under tf_keras, whose fit calls the model's train_step (Keras 3's
    # async runs the package's own loop, which does not, so the step log would stay empty).
    env["TF_USE_LEGACY_KERAS"] = "1" if mode == "async" else "0"
    if mode in ELASTIC:
        # A lost rank is found by the ranks it was not connected to only at the collective
        # timeout (tfsyncmodes/strategies/horovod_start.py): keep it short; a rank coming back
        # is waited for up to the join timeout (the knob's default, 120 s).
        env.update(TFSYNC_ELASTIC="true", TFSYNC_ELASTIC_COMMIT=str(commit),
                   TFSYNC_COLLECTIVE_TIMEOUT=f"{collective_timeout:g}")
        if mode == "hybrid":  # one group per host name (a rank each), averaged every commit / 2 steps
            env.update(TFSYNC_PERIOD=str(max(1, commit // 2)))
    else:  # plain SGD, as the NumPy reference trains it
        env.update(TFSYNC_STALENESS_AWARE_LR="false")
    env.update({f"TFSYNC_{key.upper()}": value for key, value in (knobs or {}).items()})
    return env


def read_steps(work: str, mode: str) -> List[tuple]:
    """(begin, end, step, rank, size) of every step the chief's world logged, by end time."""
    records = []
    for name in os.listdir(work):
        if name.startswith("steps-"):
            with open(os.path.join(work, name), encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    parts = line.split()
                    if len(parts) == 5:
                        records.append((float(parts[0]), float(parts[1]), int(parts[2]), int(parts[3]),
                                        int(parts[4])))
    if mode in ELASTIC:
        records = [r for r in records if r[3] == 0]
    return sorted(records, key=lambda r: r[1])


def victims(work: str, mode: str, output: str) -> List[int]:
    """Pids of the live processes a kill may pick: ranks other than 0 (sync), workers (async)."""
    pids = {}
    if mode in ELASTIC:
        for name in os.listdir(work):
            if name.startswith("rank-"):
                with open(os.path.join(work, name), encoding="utf-8") as handle:
                    fields = handle.read().split()
                if len(fields) == 2 and fields[0] != "0":
                    pids[name] = int(name[5:])
    else:
        for task, pid in re.findall(r"\[launch\] started (worker:\d+) pid (\d+)", output):
            pids[task] = int(pid)  # the latest process of each task
    return sorted(pid for pid in pids.values() if alive(pid))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def serving(pid: int) -> bool:
    """Whether process `pid` listens on a TCP port: an async worker task's server is up (a
    restarted task is used again only once it serves, and TensorFlow's coordinator takes lost
    workers back only when every lost one serves: docs/fault-tolerance.md). It looks at the
    process itself: a task started cold, as the benchmark starts them."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as handle:
                rows = [line.split() for line in handle.readlines()[1:]]
        except OSError:
            continue
        if any(len(row) > 9 and row[3] == "0A" and row[9] in inodes for row in rows):  # 0A: LISTEN
            return True
    return False


def left_behind(run_id: str) -> List[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    marked = f"{RUN_MARK}={run_id}".encode() in handle.read().split(b"\0")
            except OSError:
                continue
            if marked and alive(int(entry)):
                found.append(int(entry))
    return found


def analyse(records: Sequence[tuple], kills: Sequence[float], rollback: bool) -> dict:
    """Counted steps, wall time, pace, goodput and recovery times (see the module's docstring)."""
    if rollback:
        last = {}
        for record in records:  # by end time: a later record of a step replaces an earlier one
            last[record[2]] = record
        counted = sorted(last.values(), key=lambda r: r[1])
    else:
        counted = list(records)
    if len(counted) < 2:
        return {"counted": len(counted), "records": len(records), "goodput": None, "recoveries": []}
    ends = np.array([r[1] for r in counted])
    start = min(r[0] for r in counted)
    wall = float(ends[-1] - start)
    window = min(WINDOW, len(ends) - 1)
    pace = float(np.median((ends[window:] - ends[:-window]) / window))
    recoveries = []
    for kill in kills:
        after = ends[ends > kill]
        recoveries.append(float(after[0] - kill) if len(after) else None)
    return {"counted": len(counted), "records": len(records), "rolled_back": len(records) - len(counted),
            "train_seconds": wall, "pace": pace, "goodput": min(1.0, len(counted) * pace / wall),
            "recoveries": recoveries, "first_step_unix": start, "last_step_unix": float(ends[-1])}
