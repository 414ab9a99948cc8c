"""What the launcher (:mod:`tfsyncmodes.launch`) starts: a loopback-only network namespace to
run the cluster in, a cluster spec of free 127.0.0.1 ports, and each task's process, its output
relayed line by line with the task's name in front.

Like the launcher, this module imports nothing from the package (so not TensorFlow); the
launcher loads it by path.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Dict, List

_PRIVATE_PREFIXES = (("unshare", "--net"), ("unshare", "--user", "--map-root-user", "--net"))
_LO_UP = ("sh", "-c", 'ip link set lo up 2>/dev/null || ifconfig lo up 2>/dev/null; exec "$@"', "sh")


def private_network_prefix() -> List[str]:
    """A command prefix that runs its command in a new network namespace that has only a
    loopback interface, or [] where this machine allows none."""
    for prefix in _PRIVATE_PREFIXES:
        command = list(prefix + _LO_UP)
        try:
            probe = subprocess.run(command + [sys.executable, "-c", _LO_PROBE], timeout=20,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0 and probe.stdout.strip() == "ok":
            return command
    return []


# Inside the namespace: loopback works and it is the only interface.
_LO_PROBE = ("import socket\n"
             "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
             "socket.create_connection(s.getsockname(), timeout=5).close()\n"
             "print('ok' if [n for _, n in socket.if_nameindex()] == ['lo'] else 'not private')")


def free_ports(count: int) -> List[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def local_cluster(workers: int, ps: int, chief: bool = True) -> Dict[str, List[str]]:
    """A cluster spec of free 127.0.0.1 ports."""
    ports = iter(free_ports(int(chief) + workers + ps))
    cluster = {"chief": [f"127.0.0.1:{next(ports)}"]} if chief else {}
    cluster["worker"] = [f"127.0.0.1:{next(ports)}" for _ in range(workers)]
    if ps:
        cluster["ps"] = [f"127.0.0.1:{next(ports)}" for _ in range(ps)]
    return cluster


def _die_with_parent() -> None:
    """In the child: be killed when the launcher dies, however it dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Task:
    def __init__(self, role: str, index: int, command: List[str], cluster, lock: threading.Lock):
        self.name = f"{role}:{index}"
        self.role = role
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": role, "index": index}}),
                   PYTHONUNBUFFERED="1")
        # RPCs to a lost task fail at once instead of waiting for it (the caller's choice, as
        # docs/troubleshooting.md asks of every async task); a value the user set is kept.
        env.setdefault("GRPC_FAIL_FAST", "use_caller")
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, text=True, errors="replace",
                                        start_new_session=True, preexec_fn=_die_with_parent)
        self._reader = threading.Thread(target=self._relay, args=(lock,), daemon=True)
        self._reader.start()

    def _relay(self, lock: threading.Lock) -> None:
        for line in self.process.stdout:
            with lock:
                try:
                    sys.stdout.write(f"[{self.name}] {line}")
                    sys.stdout.flush()
                except (BrokenPipeError, ValueError):
                    pass  # nobody reads our output any more; keep draining the task's

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def finish_output(self) -> None:
        self._reader.join(timeout=2.0)
