"""Start a whole local TF_CONFIG cluster and run a script in every task of it.

    python -m tfsyncmodes.launch --workers 2 --ps 1 -- python scripts/train.py --sync_mode=async

Like ``horovodrun`` and ``torchrun``: one command, free ports on 127.0.0.1, one TF_CONFIG per
process (a ``chief``, ``--workers`` workers and ``--ps`` parameter servers), every output
line prefixed by its task. The cluster is torn down (SIGTERM, then SIGKILL) when the chief
ends, when any other task dies (unless ``--tolerate_worker_loss`` and it was a worker), on
Ctrl-C or SIGTERM, and on ``--timeout``. The exit status is the chief's (124 on timeout, 130
when interrupted, 1 when another task's death ended the run).

``--max_restarts N``, as ``torchrun`` users know it: a worker that dies is started again at
its address (the chief's coordinator takes it back), up to N times each; a parameter server
or chief that dies stops the cluster, which starts again on fresh ports, the chief resuming
from its last backup (``strategy.callbacks(model_dir)``), up to N times in all. A chief
that exits 2 (bad input) is never restarted.

TensorFlow's gRPC servers listen on every interface whatever address TF_CONFIG gives them, so
where the machine allows it (root, or unprivileged user namespaces) the launcher re-executes
itself in a network namespace of its own with only a loopback interface: the cluster is
private to this machine. ``--share_network`` keeps the machine's network (for tasks that must
reach other hosts, e.g. to download data; the ports are then open to the network).

A command whose ``--sync_mode_schedule`` passes through async runs phase after phase, each on its
own process layout (``horovodrun -np --np`` for sync and hybrid, this cluster for async); see
:mod:`tfsyncmodes.switching.phases.launching`.

``--print-tf-config --hosts a,b --workers 2 --ps 1`` starts nothing: it prints each task's
TF_CONFIG for a cluster over those hosts (see :mod:`tfsyncmodes.tf_configs`).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Dict, List, Optional

GRACE_SECONDS = 5.0
PRIVATE_MARK = "TFSYNCMODES_LAUNCH_PRIVATE"  # set inside the loopback-only namespace

# This file alone (it imports nothing from the package, so not TensorFlow), as __main__.
_RUN_THIS_FILE = "import runpy, sys; path = sys.argv.pop(1); sys.argv[0] = path; runpy.run_path(path, run_name='__main__')"


def _sibling(relative: str):
    """A module of the package next to this file (launch_options.py, launch_processes.py,
    tf_configs.py, switching/phases/launching.py),
    loaded by path: like this file, those import nothing from the package, so not TensorFlow."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), relative)
    name = "tfsyncmodes_launch_" + relative.replace(os.sep, "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_processes = _sibling("launch_processes.py")
Task = _processes.Task


class Launcher:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.lock = threading.Lock()
        self.tasks: List[Task] = []
        self.cluster: Dict[str, List[str]] = {}
        self.stop_reason: Optional[str] = None
        self.cluster_restarts = 0
        self.worker_restarts: Dict[str, int] = {}

    def say(self, text: str) -> None:
        with self.lock:
            try:
                sys.stdout.write(f"[launch] {text}\n")
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):
                pass

    def run(self) -> int:
        if os.environ.get(PRIVATE_MARK) == "1":
            self.say("network: a namespace of its own with loopback only; nothing listens beyond it")
        else:
            self.say("network: shared with this machine; the tasks' ports are open on every interface")
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)
        deadline = time.monotonic() + self.args.timeout if self.args.timeout else None
        while True:
            status, restart = self._run_cluster(deadline)
            if not restart:
                return status

    def _start(self, role: str, index: int) -> Task:
        task = Task(role, index, self.args.command, self.cluster, self.lock)
        self.say(f"started {task.name} pid {task.process.pid}")
        return task

    def _run_cluster(self, deadline: Optional[float]):
        """Starts every task and waits for the chief; (exit status, whether to start again)."""
        self.cluster = _processes.local_cluster(self.args.workers, self.args.ps)
        self.say("cluster " + json.dumps(self.cluster))
        self.tasks = [self._start(role, index) for role in ("ps", "worker", "chief")
                      for index in range(len(self.cluster.get(role, ())))]
        chief = self.tasks[-1]
        reported = set()
        status, restart = None, False
        while status is None:
            if self.stop_reason:
                status = 130
                break
            if chief.process.poll() is not None:
                # A task that failed first (and so, often, ended the chief) is reported too;
                # one that exited 0 may just have seen the chief finish.
                self._report_exits(reported, failures_only=True)
                status = chief.process.returncode
                restart = status not in (0, 2) and self._restart_cluster(f"chief:0 exited with status {status}")
                break
            status, restart = self._report_exits(reported)
            if deadline is not None and time.monotonic() > deadline:
                self.say(f"timeout after {self.args.timeout:g}s; stopping the cluster")
                status, restart = 124, False
            time.sleep(0.1)
        self.teardown()
        self.say("exit statuses: " + " ".join(f"{t.name}={t.process.returncode}" for t in self.tasks))
        return status, restart

    def _restart_cluster(self, why: str) -> bool:
        """Whether --max_restarts allows starting the cluster again after `why` (says so)."""
        if self.cluster_restarts >= self.args.max_restarts:
            return False
        self.cluster_restarts += 1
        self.say(f"{why}; restarting the cluster, the chief resumes from its last backup "
                 f"(restart {self.cluster_restarts} of {self.args.max_restarts})")
        return True

    def _report_exits(self, reported: set, failures_only: bool = False):
        """Says which tasks besides the chief have exited (with a non-zero status, if
        `failures_only`, which only reports) since the last call, and acts: a failed worker
        is restarted at its address while --max_restarts allows, or tolerated; any other
        failure stops the cluster (status 1), which a failed ps starts again while
        --max_restarts allows. (status or None, restart the cluster)."""
        for position, task in enumerate(self.tasks[:-1]):
            code = task.process.poll()
            if code is None or task.name in reported or (failures_only and code == 0):
                continue
            reported.add(task.name)
            if code == 0:  # e.g. a MultiWorkerMirrored worker that finished a moment before the chief
                self.say(f"{task.name} finished (status 0); waiting for the chief")
            elif failures_only:
                self.say(f"{task.name} exited with status {code}")
            elif task.role == "worker" and self.worker_restarts.get(task.name, 0) < self.args.max_restarts:
                count = self.worker_restarts[task.name] = self.worker_restarts.get(task.name, 0) + 1
                index = int(task.name.split(":")[1])
                self.say(f"{task.name} exited with status {code}; restarting it at "
                         f"{self.cluster['worker'][index]} (restart {count} of {self.args.max_restarts})")
                task.finish_output()
                self.tasks[position] = self._start("worker", index)
                reported.discard(task.name)
            elif task.role == "worker" and self.args.tolerate_worker_loss:
                self.say(f"{task.name} exited with status {code}; the others go on")
            else:  # a ps (the cluster starts again while it may), or a worker out of restarts
                restart = task.role == "ps" and self._restart_cluster(f"{task.name} exited with status {code}")
                if not restart:
                    self.say(f"{task.name} exited with status {code}; stopping the cluster")
                return 1, restart
        return None, False

    def _on_signal(self, signum, frame) -> None:
        del frame
        self.stop_reason = signal.Signals(signum).name

    def teardown(self) -> None:
        """Gives the tasks a moment to leave on their own (they exit once the chief is gone),
        then SIGTERM, then SIGKILL; waits for every one."""
        deadline = time.monotonic() + GRACE_SECONDS
        while time.monotonic() < deadline and any(t.process.poll() is None for t in self.tasks):
            time.sleep(0.1)
        for signum in (signal.SIGTERM, signal.SIGKILL):
            alive = [t for t in self.tasks if t.process.poll() is None]
            for task in alive:
                task.signal(signum)
            deadline = time.monotonic() + GRACE_SECONDS
            while time.monotonic() < deadline and any(t.process.poll() is None for t in alive):
                time.sleep(0.1)
        for task in self.tasks:
            task.signal(signal.SIGKILL)  # whatever a task itself started
            task.process.wait()
            task.finish_output()


def parse_args(argv: List[str]):
    """The launcher's options, checked (tfsyncmodes/launch_options.py)."""
    return _sibling("launch_options.py").parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.print_tf_config:
        sys.stdout.write(_sibling("tf_configs.py").render(args.hosts, args.workers, args.ps, args.port))
        return 0
    phases = _sibling(os.path.join("switching", "phases", "launching.py")) if not args.print_tf_config else None
    if phases is not None and phases.wants_phases(args.command):
        try:
            phases.check(args)
        except phases.BadInput as error:
            print(f"tfsyncmodes.launch: error: {error}", file=sys.stderr, flush=True)
            return 2
    if not args.share_network and os.environ.get(PRIVATE_MARK) != "1":
        prefix = _processes.private_network_prefix()
        if prefix:  # the same process (exec), so signals sent to it still reach the launcher
            sys.stdout.flush()
            os.execvpe(prefix[0], prefix + [sys.executable, "-c", _RUN_THIS_FILE, os.path.abspath(__file__), *argv],
                       dict(os.environ, **{PRIVATE_MARK: "1"}))
    if phases is not None and phases.wants_phases(args.command):
        return phases.run(args, Launcher, private=os.environ.get(PRIVATE_MARK) == "1")
    return Launcher(args).run()


if __name__ == "__main__":
    sys.exit(main())
