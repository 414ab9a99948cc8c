"""Check a discovery script for elastic ``horovodrun`` before a job depends on it.

``horovodrun --host-discovery-script S`` runs ``S`` every second and reads one ``host`` or
``host:slots`` line per available host. Horovod runs it, not the ranks, so a script that is
missing, fails or prints garbage stops the job in Horovod's driver with a traceback (at the
first discovery), is logged and ignored (later), or yields a host name no SSH can reach. Run the
script once here first: its hosts as Horovod will read them, or one line and exit status 2::

    python -m tfsyncmodes.discover --check ./discover.sh

The output is read with Horovod's rules (``--slots`` for a host named without ``:slots``), and
refused where Horovod would fail or take a wrong host name: a slots field that is not a positive
integer, more than one ``:``, white space or ``#`` in a line, or no host at all. (The script
itself stays a shell script: ``horovodrun`` runs it every second, too often to import Python's
TensorFlow stack each time.)
"""
from __future__ import annotations

import os
import re
import signal
import subprocess

from absl import flags

from tfsyncmodes.errors import ConfigError, run

flags.DEFINE_string("check", None, "Run this discovery script once, check its output and print its hosts.")
flags.DEFINE_integer("slots", 1, "Slots of a host named without ':slots' (horovodrun's --slots).", lower_bound=1)
flags.DEFINE_float("timeout", 10.0, "Seconds the script may take.", lower_bound=0.1)
FLAGS = flags.FLAGS

HOST = re.compile(r"[A-Za-z0-9_.-]+")
FIX = "write one 'host' or 'host:slots' line per host (e.g. node1:4)"


def parse(text: str, source: str, default_slots: int) -> dict[str, int]:
    """``{host: slots}`` of discovery output, read as Horovod reads it; a line Horovod would fail
    on or misread raises :class:`ConfigError`."""
    hosts: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line:
            continue
        host, _, slots = line.partition(":")
        field = f"output line {number}"
        if not HOST.fullmatch(host):
            raise ConfigError(source, field, f"{line!r} does not start with a host name", FIX)
        if ":" in line and not re.fullmatch(r"[1-9][0-9]*", slots.strip()):
            raise ConfigError(source, field, f"{line!r}: slots {slots!r} is not a positive integer", FIX)
        hosts[host] = int(slots) if slots else default_slots
    return hosts


def run_script(script: str, default_slots: int, timeout: float) -> dict[str, int]:
    """Run ``script`` as Horovod does (through the shell, its standard output read) and parse it."""
    source = f"--check {script}"
    command = script.split()[0] if script.split() else ""
    if not command or (os.sep in command and not os.path.isfile(command)):
        raise ConfigError(source, "script", "does not exist", "give the path of the discovery script")
    if os.sep in command and not os.access(command, os.X_OK):
        raise ConfigError(source, "script", "is not executable", f"chmod +x {command}")
    # Its own session, so that a script that hangs is stopped with everything it started.
    with subprocess.Popen(script, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise ConfigError(source, "script", f"did not finish in {timeout:g} s",
                              "make it print the hosts and exit (horovodrun runs it every second)") from None
    if process.returncode != 0:
        last = (stderr.strip().splitlines() or [""])[-1]
        status = f"{process.returncode} ({last})" if last else str(process.returncode)
        raise ConfigError(source, "exit status", status,
                          "horovodrun stops the job at the first discovery that fails: make it exit 0")
    hosts = parse(stdout, source, default_slots)
    if not hosts:
        raise ConfigError(source, "output", "names no host", FIX)
    return hosts


def main(argv) -> None:
    del argv
    if not FLAGS.check:  # not absl's required flag: its validator would fail any parse of the flags
        raise ConfigError("flag", "--check", "is required", "name the discovery script: --check ./discover.sh")
    for host, slots in run_script(FLAGS.check, FLAGS.slots, FLAGS.timeout).items():
        print(f"{host}:{slots}")


if __name__ == "__main__":
    run(main)
