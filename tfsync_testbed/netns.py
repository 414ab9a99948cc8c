"""A multi-host test bed on one machine: network namespaces as hosts on a private bridge.

    with HostBed(2) as bed:                       # needs root and ``ip``; else HostBedUnavailable
        a, b = bed.hosts                          # a.address == "10.213.77.1", b: "10.213.77.2"
        b.run(["python", "-c", "..."], timeout=60)
        process = a.popen([...])                  # started inside a's namespace

Each host is a namespace ``tfsyncmodes-<pid>-h<i>`` with a loopback interface and one veth
interface, named :data:`IFACE` in every host, whose other end is on a bridge that the bed
creates. The bridge has no address of its own, so nothing outside the namespaces can reach, or
be reached through, the bed's subnet (:data:`SUBNET`, which nothing else on the machine uses).

Like real machines, each host has its own name (``hostA``, ``hostB``, ...: commands run in a
UTS namespace of their own) that resolves, inside every host, to that host's address
(``/etc/netns/<namespace>/hosts``, which ``ip netns exec`` mounts over ``/etc/hosts``). Horovod
0.28.1 needs that: the Gloo contexts of its process sets (the global one included) take their
address from the host name, not from ``--network-interface``.

Cleanup kills every process in the namespaces, deletes them (which deletes their veths) and
the bridge: on ``__exit__``, at interpreter exit (a SIGTERM to the owner unwinds to it, where
nothing else handles that signal), and, for a bed whose owner died without either (killed),
at the next bed's start (:func:`remove_stale_beds`).
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from typing import List, Optional, Sequence

from tfsync_testbed import localrun, shaping
from tfsync_testbed.shaping import IFACE  # the veth inside every host: what --network-interface names

SUBNET = "10.213.77"  # /24; host i (0-based) is SUBNET.(i + 1)
PREFIX = "tfsyncmodes-"
ETC_NETNS = "/etc/netns"
_NAME = re.compile(rf"^{PREFIX}(\d+)-h(\d+)$")


class HostBedUnavailable(RuntimeError):
    """Namespaces cannot be created here; the message says why (tests skip with it)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, timeout=30)
    if check and result.returncode != 0:
        raise HostBedUnavailable(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result


def why_unavailable() -> Optional[str]:
    """None where a bed can be built here, else the reason."""
    if os.geteuid() != 0:
        return "network namespaces as hosts need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(namespace: str) -> None:
    for _ in range(50):
        pids = _ip("netns", "pids", namespace, check=False).stdout.split()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        time.sleep(0.1)


def _delete_namespace(namespace: str) -> None:
    _kill_namespace_processes(namespace)
    _ip("netns", "del", namespace, check=False)
    shutil.rmtree(os.path.join(ETC_NETNS, namespace), ignore_errors=True)
    try:
        os.rmdir(ETC_NETNS)  # only when no other namespace has files there
    except OSError:
        pass


def _port_state(link: str) -> str:
    try:
        with open(f"/sys/class/net/{link}/brport/state", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _bridge_name(owner: int) -> str:
    return f"tfsbr{owner}"[:15]


def remove_stale_beds() -> List[str]:
    """Deletes the namespaces and bridges of beds whose owning process is gone."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        match = _NAME.match(name)
        if match and not _pid_alive(int(match.group(1))):
            _delete_namespace(name)
            removed.append(name)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        match = re.match(r"^\d+: (tfsbr(\d+))[:@]", line)
        if match and not _pid_alive(int(match.group(2))):
            _ip("link", "del", match.group(1), check=False)
            removed.append(match.group(1))
    return removed


def host_name(index: int) -> str:
    return f"host{chr(ord('A') + index)}" if index < 26 else f"host{index}"


class Host:
    """One namespace: `address` on interface :data:`IFACE`; commands run inside it."""

    def __init__(self, index: int, namespace: str, address: str):
        self.index = index
        self.name = host_name(index)
        self.namespace = namespace
        self.address = address
        self.iface = IFACE

    def wrap(self, command: Sequence[str]) -> List[str]:
        """`command` as a command line that runs it on this host."""
        return ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.name, *map(str, command)]

    def popen(self, command: Sequence[str], **kwargs) -> subprocess.Popen:
        """Starts `command` on this host in its own process group (kwargs go to Popen)."""
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(self.wrap(command), **kwargs)

    def run(self, command: Sequence[str], *, timeout: float, env=None, cwd=None) -> subprocess.CompletedProcess:
        """Runs `command` on this host; its process group is killed on timeout."""
        return localrun.run(self.wrap(command), timeout=timeout, env=env, cwd=cwd)

    def listening(self) -> List[str]:
        """``local-address:port`` of every TCP socket listening on this host (``ss -ltn``)."""
        return listening(self.wrap(["ss", "-Hltn"]))

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.address}, ns={self.namespace})"


def listening(ss_command: Sequence[str] = ("ss", "-Hltn")) -> List[str]:
    out = subprocess.run(list(ss_command), stdout=subprocess.PIPE, text=True, timeout=30, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if len(line.split()) >= 4]


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


class HostBed:
    """N hosts on a private bridge; a context manager that removes everything it made."""

    def __init__(self, count: int = 2):
        if not 1 <= count <= 250:
            raise ValueError(f"count: {count}; use 1..250")
        self.count = count
        self.owner = os.getpid()
        self.bridge = _bridge_name(self.owner)
        self.hosts: List[Host] = []
        self._closed = True
        self._sigterm = None  # the handler replaced while the bed stands, if any

    def __enter__(self) -> "HostBed":
        reason = why_unavailable()
        if reason:
            raise HostBedUnavailable(reason)
        remove_stale_beds()
        self._closed = False
        atexit.register(self.close)
        # SIGTERM's default ends the process without atexit: unwind instead, so the bed is
        # removed (where nothing else handles SIGTERM, and only from the main thread).
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        if _ip("link", "show", self.bridge, check=False).returncode == 0:
            raise HostBedUnavailable(f"bridge {self.bridge} exists already: one bed per process at a time")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{SUBNET}.{i + 1} {host_name(i)}\n" for i in range(self.count))
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for index in range(self.count):
            namespace = f"{PREFIX}{self.owner}-h{index}"
            outer = f"tfsv{self.owner}h{index}"[:15]
            address = f"{SUBNET}.{index + 1}"
            _ip("link", "del", outer, check=False)  # a pair an earlier bed of this process left
            _ip("netns", "add", namespace)
            self.hosts.append(Host(index, namespace, address))
            os.makedirs(os.path.join(ETC_NETNS, namespace), exist_ok=True)
            with open(os.path.join(ETC_NETNS, namespace, "hosts"), "w", encoding="ascii") as handle:
                handle.write(hosts_file)
            _ip("link", "add", outer, "type", "veth", "peer", "name", IFACE, "netns", namespace)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            for args in (("addr", "add", f"{address}/24", "dev", IFACE), ("link", "set", IFACE, "up"),
                         ("link", "set", "lo", "up")):
                _ip("-n", namespace, *args)
        for host in self.hosts:  # wait until the bridge forwards on every port
            outer = f"tfsv{self.owner}h{host.index}"[:15]
            deadline = time.monotonic() + 20
            while _port_state(outer) != "3":  # BR_STATE_FORWARDING
                if time.monotonic() > deadline:
                    raise HostBedUnavailable(f"bridge port {outer} of {host.name} does not forward")
                time.sleep(0.1)

    def shape(self, rate: Optional[str], burst: str = "256kb", latency: str = "50ms",
              hosts: Optional[Sequence["Host"]] = None, first_bytes: int = 0, flows: int = 0) -> None:
        """Rate-limits the outgoing traffic on the bridge of every host (or of `hosts`) to `rate`
        (e.g. "100mbit"); None removes the limit. One queue holds up to `latency` of the rate;
        with `first_bytes`, packets under that many bytes go first; with `flows`, each
        connection has a queue of its own (:mod:`tfsync_testbed.shaping`)."""
        commands = [] if rate is None else shaping.tc_commands(rate, burst, latency, first_bytes, flows)
        batch = "".join(" ".join(command) + "\n" for command in commands)
        for host in self.hosts if hosts is None else hosts:
            subprocess.run(host.wrap(["tc", "qdisc", "del", "dev", IFACE, "root"]), timeout=30,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if commands:  # one tc for them all (a flow tree is some 300 commands)
                subprocess.run(host.wrap(["tc", "-batch", "-"]), input=batch, text=True, check=True, timeout=30)

    def sysctl(self, name: str, value: str) -> None:
        """Sets a network sysctl in every host (each namespace has its own, e.g.
        ``net.ipv4.tcp_slow_start_after_idle``)."""
        for host in self.hosts:
            subprocess.run(host.wrap(["sysctl", "-q", "-w", f"{name}={value}"]), check=True, timeout=30)

    def counters(self) -> List[dict]:
        """Per host, since its namespace was made: packets its shaped link dropped (``tc -s``:
        the tbf queue full) and TCP segments it sent again (``/proc/net/snmp`` of its namespace:
        a loss, or a timeout that thought so)."""
        out = []
        for host in self.hosts:
            qdisc = subprocess.run(host.wrap(["tc", "-s", "qdisc", "show", "dev", IFACE]), stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True, timeout=30).stdout
            snmp = subprocess.run(host.wrap(["cat", "/proc/net/snmp"]), stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, timeout=30).stdout
            dropped = re.search(r"dropped (\d+)", qdisc)
            tcp = [line.split() for line in snmp.splitlines() if line.startswith("Tcp:")]
            fields = dict(zip(tcp[0][1:], tcp[1][1:])) if len(tcp) == 2 else {}
            out.append({"dropped": int(dropped.group(1)) if dropped else 0,
                        "retransmitted": int(fields.get("RetransSegs", 0))})
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for host in self.hosts:
            # Deleting one end removes the pair now; a namespace's own removal may lag.
            _ip("link", "del", f"tfsv{self.owner}h{host.index}"[:15], check=False)
            _delete_namespace(host.namespace)
        _ip("link", "del", self.bridge, check=False)
        if self._sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001 - interpreter shutting down
            pass

    def __exit__(self, *exc) -> None:
        self.close()
