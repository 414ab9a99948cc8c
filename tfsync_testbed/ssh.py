"""SSH between the hosts of a :class:`~tfsync_testbed.netns.HostBed`, for ``horovodrun -H``.

    with HostBed(2) as bed, SshMesh(bed, workdir) as mesh:
        env = mesh.env(os.environ)      # PATH starts with an ``ssh`` that never prompts
        bed.hosts[0].run(["horovodrun", *mesh.horovodrun_args(), ...], env=env, timeout=...)

One ``sshd`` per host, started in the host's namespace in the foreground, listening on that
host's address only (``ListenAddress``), with a host key and one client key generated for
the run, key authentication only. The client side is a small ``ssh`` wrapper placed first on
``PATH`` (horovodrun calls ``ssh`` by name): it adds the key, a known_hosts file inside
`workdir` and ``StrictHostKeyChecking=no``, so nothing prompts and nothing is written outside
`workdir`. Everything stops on ``__exit__``.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from typing import List, Mapping

from tfsync_testbed import localrun
from tfsync_testbed.netns import HostBed, HostBedUnavailable

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/usr/bin/sshd")

_SSHD_CONFIG = """\
ListenAddress {address}
Port {port}
HostKey {host_key}
AuthorizedKeysFile {authorized_keys}
PidFile none
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PrintMotd no
AcceptEnv *
"""

_WRAPPER = """#!/bin/sh
exec {ssh} -F none -i {key} -o IdentitiesOnly=yes -o UserKnownHostsFile={known_hosts} \
-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o BatchMode=yes -o LogLevel=ERROR \
-o ConnectTimeout=10 "$@"
"""


def sshd_path() -> str:
    for candidate in SSHD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return ""


def why_unavailable() -> str:
    """'' where the mesh can be built, else the reason (tests skip with it)."""
    missing = [name for name, found in (("sshd", sshd_path()), ("ssh", shutil.which("ssh")),
                                        ("ssh-keygen", shutil.which("ssh-keygen"))) if not found]
    if missing:
        return (f"OpenSSH is not installed ({', '.join(missing)} missing); bash scripts/test.sh installs it "
                "as root on Debian/Ubuntu, or: apt-get install openssh-server openssh-client")
    return ""


class SshMesh:
    PORT = 22

    def __init__(self, bed: HostBed, workdir: str):
        self.bed = bed
        self.workdir = os.path.join(str(workdir), "ssh")
        self.key = os.path.join(self.workdir, "id_ed25519")
        self.processes: List[subprocess.Popen] = []

    def __enter__(self) -> "SshMesh":
        reason = why_unavailable()
        if reason:
            raise HostBedUnavailable(reason)
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        os.makedirs(self.workdir, mode=0o700, exist_ok=True)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        host_key = os.path.join(self.workdir, "host_ed25519")
        for path in (self.key, host_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True, timeout=30,
                           stdout=subprocess.DEVNULL)
        authorized = os.path.join(self.workdir, "authorized_keys")
        shutil.copyfile(self.key + ".pub", authorized)
        bindir = os.path.join(self.workdir, "bin")
        os.makedirs(bindir, exist_ok=True)
        wrapper = os.path.join(bindir, "ssh")
        with open(wrapper, "w", encoding="utf-8") as handle:
            handle.write(_WRAPPER.format(ssh=shutil.which("ssh"), key=self.key,
                                         known_hosts=os.path.join(self.workdir, "known_hosts")))
        os.chmod(wrapper, stat.S_IRWXU)
        for host in self.bed.hosts:
            config = os.path.join(self.workdir, f"sshd_{host.name}.conf")
            with open(config, "w", encoding="utf-8") as handle:
                handle.write(_SSHD_CONFIG.format(address=host.address, port=self.PORT, host_key=host_key,
                                                 authorized_keys=authorized))
            log = open(os.path.join(self.workdir, f"sshd_{host.name}.log"), "w", encoding="utf-8")
            with log:
                self.processes.append(host.popen([sshd_path(), "-D", "-e", "-f", config], stdout=log,
                                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        for host in self.bed.hosts:
            self._wait_listening(host)

    def _wait_listening(self, host) -> None:
        deadline = time.monotonic() + 20
        while f"{host.address}:{self.PORT}" not in host.listening():
            if any(p.poll() is not None for p in self.processes) or time.monotonic() > deadline:
                log = os.path.join(self.workdir, f"sshd_{host.name}.log")
                with open(log, encoding="utf-8", errors="replace") as handle:
                    raise HostBedUnavailable(f"sshd on {host.name} did not start: {handle.read()[-500:]}")
            time.sleep(0.1)

    @property
    def bindir(self) -> str:
        return os.path.join(self.workdir, "bin")

    def env(self, base: Mapping[str, str]) -> dict:
        """`base` with the non-prompting ``ssh`` first on PATH."""
        env = dict(base)
        env["PATH"] = self.bindir + os.pathsep + env.get("PATH", os.defpath)
        return env

    def horovodrun_args(self) -> List[str]:
        """``-p PORT --ssh-identity-file KEY``, for horovodrun's own ssh probes."""
        return ["-p", str(self.PORT), "--ssh-identity-file", self.key]

    def close(self) -> None:
        for process in self.processes:
            localrun.kill_group(process)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.processes = []

    def __exit__(self, *exc) -> None:
        self.close()

