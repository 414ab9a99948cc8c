"""One chaos run: start the 4-rank job, kill a random non-chief process every interval, wait
for the end, and measure (:mod:`benchmarks.chaoslib` says what is measured and how)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Optional, Sequence

import numpy as np

from benchmarks import chaoslib
from tfsync_testbed import localrun


def run(mode: str, *, interval: Optional[Sequence[float]], seed: int = 0, epochs: int = 10,
        steps_per_epoch: int = 100, step_ms: float = 50.0, commit: int = 10, collective_timeout: float = 5,
        max_kills: Optional[int] = None, quiet_tail: float = 0.15, timeout: float = 900,
        python: str = sys.executable, warm: bool = False, knobs: Optional[dict] = None) -> dict:
    """A chaos run of `mode` ("sync", "hybrid" or "async"); `interval` (low, high) seconds between kills,
    None for an undisturbed run. No kill comes before the first step or once the job is within
    `quiet_tail` of its promised steps (so that each failure has its recovery inside the run);
    in sync and hybrid, none until the world has its every rank again and has finished a step.
    `python` is the interpreter of the job's processes; `warm`: sync's and hybrid's ranks start
    through ``tfsyncmodes_warm``; `knobs`: {key: value} set as ``TFSYNC_KEY``. Returns the analysis, the kills, the
    final state the chief wrote, and what was left behind (every process of the run is killed
    and its temporary directory removed in any case)."""
    if mode not in chaoslib.MODES:
        raise ValueError(f"chaos runs exist for {', '.join(chaoslib.MODES)}, not {mode!r}")
    promised = epochs * steps_per_epoch
    low = interval[0] if interval else 1.0
    budget = max_kills if max_kills is not None else int(promised * step_ms / 1000 / max(low, 1.0)) + 4
    rng = random.Random(seed)
    run_id = uuid.uuid4().hex
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="chaos-") as work:
        log = open(os.path.join(work, "output.log"), "w+", encoding="utf-8", errors="replace")
        job = subprocess.Popen(
            chaoslib.command(mode, work, epochs, steps_per_epoch, step_ms, budget, python, warm),
            cwd=chaoslib.REPO, env=chaoslib.environment(mode, run_id, commit, collective_timeout, knobs), stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
        kills, victims, status = [], [], None
        seen, served = {}, {}  # async: when the driver first saw each worker process, and saw it serve
        try:
            next_kill = None
            deadline = time.monotonic() + timeout
            while job.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
                live = None  # async: its workers' live processes, read once an iteration
                if mode == "async":
                    live = chaoslib.victims(work, mode, _read(log.name))
                    for pid in live:
                        seen.setdefault(pid, time.time())
                        if pid not in served and chaoslib.serving(pid):
                            served[pid] = time.time()
                if interval is None or len(kills) >= budget:
                    continue
                records = chaoslib.read_steps(work, mode)
                if not records:
                    continue
                if next_kill is None:
                    next_kill = records[0][0] + rng.uniform(*interval)
                done = max(r[2] for r in records) / promised
                if time.time() < next_kill or done > 1 - quiet_tail:
                    continue
                candidates = live if live is not None else chaoslib.victims(work, mode, _read(log.name))
                # An elastic world waits for the lost rank to be back, and for a step of the whole
                # world after it, before losing another. A rank lost while the world re-formed
                # left a hybrid chaos test's job unfinished once: Horovod's elastic driver logged
                # "State READY overridden by FAILURE" at its rendezvous, and no step came after.
                if not candidates or (mode in chaoslib.ELASTIC and (
                        len(candidates) < chaoslib.WORKERS - 1 or records[-1][4] < chaoslib.WORKERS
                        or (kills and records[-1][1] < kills[-1]))):
                    continue
                pid = rng.choice(candidates)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                kills.append(time.time())
                victims.append(pid)
                next_kill = kills[-1] + rng.uniform(*interval)
            status = job.poll()
        finally:
            localrun.kill_group(job, signal.SIGTERM)
            try:
                job.wait(timeout=20)
            except subprocess.TimeoutExpired:
                localrun.kill_group(job)
                job.wait()
            ended = time.time()
            # A process of the run may take a moment to leave after the job (a warm server left
            # about a second after it): left behind is still there after 5 s.
            settle = time.monotonic() + 5
            while chaoslib.left_behind(run_id) and time.monotonic() < settle:
                time.sleep(0.1)
            leftovers = chaoslib.left_behind(run_id)
            for pid in leftovers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            log.seek(0)
            output = log.read()
            log.close()
        records = chaoslib.read_steps(work, mode)
        final = os.path.join(work, "final.npz")
        weights = {k: v for k, v in np.load(final).items()} if os.path.exists(final) else None
    result = chaoslib.analyse(records, kills, rollback=mode in chaoslib.ELASTIC)
    if mode == "async":
        # A restarted worker's time from its start to serving, and the kills that hit a worker
        # before it served again (at the driver's 0.2 s polling).
        first = min(seen.values(), default=started)
        restarts = [pid for pid in seen if seen[pid] > first + 1]
        result.update(serve_seconds=[served[pid] - seen[pid] for pid in restarts if pid in served],
                      killed_before_serving=sum(1 for pid in victims if pid not in served))
    result.update(mode=mode, interval=list(interval) if interval else None, seed=seed, status=status,
                  promised_steps=promised, kills=[k - started for k in kills], kill_times=kills, victims=victims,
                  wall_seconds=ended - started, leftovers=leftovers, output=output, step_log=records,
                  final=weights, work=work)
    if records:
        result["startup_seconds"] = records[0][0] - started
    return result


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()
