"""``python -m tfsyncmodes.discover --check SCRIPT``: a discovery script's hosts as Horovod reads
them, or one line and exit status 2. Horovod's own parser (``HostDiscoveryScript``) is the
reference: where it reads hosts, the check prints the same; where it fails, the check refuses."""
from __future__ import annotations

import os
import subprocess
import time

import pytest
from horovod.runner.elastic.discovery import HostDiscoveryScript

from tests.conftest import PYTHON, REPO, clean_env
from tfsyncmodes.discover import run_script
from tfsyncmodes.errors import ConfigError


def script(tmp_path, body, name="discover.sh", mode=0o755):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return str(path)


def cli(*args):
    return subprocess.run([PYTHON, "-m", "tfsyncmodes.discover", *args], capture_output=True, text=True,
                          cwd=REPO, env=clean_env(), timeout=120, check=False)


def errors(result):
    """The lines the command wrote as its own (TensorFlow's start-up lines left out)."""
    assert "Traceback" not in result.stderr, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("tfsyncmodes: error:")]


@pytest.mark.parametrize("output, slots", [
    ("localhost:2\n127.0.0.1\n", 1),
    ("node1:4\nnode2:4\nnode-3.example.internal\n", 8),
    ("node1:4\r\nnode2:1\n", 1),       # a file edited on Windows: Horovod reads the slots all the same
    ("node1:4\nnode1:4\n\n", 1),      # repeated and blank lines
])
def test_hosts_as_horovod_reads_them(tmp_path, output, slots):
    path = script(tmp_path, f"printf '{output}'".replace("\r", "\\r").replace("\n", "\\n"))
    assert run_script(path, slots, 10.0) == HostDiscoveryScript(path, slots).find_available_hosts_and_slots()


@pytest.mark.parametrize("output, horovod_fails, words", [
    ("node1:four", True, "output line 1: 'node1:four': slots 'four' is not a positive integer"),
    ("node1:2\nnode2:2:3", True, "output line 2: 'node2:2:3': slots '2:3' is not a positive integer"),
    ("node1:0", False, "slots '0' is not a positive integer"),           # Horovod takes a host of no slot
    ("node 1:2", False, "output line 1: 'node 1:2' does not start with a host name"),   # an SSH name with a space
    ("# hosts\nnode1:2", False, "'# hosts' does not start with a host name"),  # a comment read as a host
    ("", False, "output: names no host"),
])
def test_garbage_is_refused_where_horovod_fails_or_misreads(tmp_path, output, horovod_fails, words):
    path = script(tmp_path, f"printf '{output}\\n'")
    if horovod_fails:
        with pytest.raises(ValueError):
            HostDiscoveryScript(path, 1).find_available_hosts_and_slots()
    with pytest.raises(ConfigError) as error:
        run_script(path, 1, 10.0)
    assert str(error.value).startswith(f"--check {path}: ") and words in str(error.value)


def test_a_failing_or_unusable_script_is_one_reason_each(tmp_path):
    failing = script(tmp_path, "echo 'cannot reach the API server' >&2\nexit 3", "failing.sh")
    with pytest.raises(RuntimeError):
        HostDiscoveryScript(failing, 1).find_available_hosts_and_slots()
    cases = {failing: "exit status: 3 (cannot reach the API server); horovodrun stops the job",
             script(tmp_path, "echo node1:2", "plain.sh", mode=0o644): "script: is not executable; chmod +x",
             str(tmp_path / "absent.sh"): "script: does not exist"}
    for path, words in cases.items():
        with pytest.raises(ConfigError) as error:
            run_script(path, 1, 10.0)
        assert words in str(error.value), path


def test_a_script_that_hangs_is_stopped_with_what_it_started(tmp_path):
    pids = tmp_path / "pids"
    path = script(tmp_path, f"sleep 60 &\necho $$ $! > {pids}\nwait")
    started = time.monotonic()
    with pytest.raises(ConfigError, match="script: did not finish in 1 s"):
        run_script(path, 1, 1.0)
    assert time.monotonic() - started < 10
    for pid in pids.read_text().split():
        assert not running(pid), f"process {pid} of the script is still running"


def running(pid, wait=5.0):
    """Whether ``pid`` still runs after ``wait`` seconds (a zombie waiting for init does not)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
                if handle.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.1)
    return True


def test_the_command_prints_hosts_or_one_line_and_exit_2(tmp_path):
    good = cli("--check", script(tmp_path, "echo localhost:2; echo 127.0.0.1", "good.sh"), "--slots=3")
    assert (good.returncode, good.stdout) == (0, "localhost:2\n127.0.0.1:3\n"), good.stderr
    absent = str(tmp_path / "absent.sh")
    bad = cli("--check", absent)
    assert bad.returncode == 2
    assert errors(bad) == [f"tfsyncmodes: error: --check {absent}: script: does not exist; "
                           "give the path of the discovery script"]
    none = cli()
    assert none.returncode == 2 and len(errors(none)) == 1 and "--check" in errors(none)[0], none.stderr


def test_importing_the_check_leaves_any_parse_of_the_flags_valid():
    # Tests and users' scripts parse absl's global flags in the process that imported this
    # module: its --check must not be a required flag there.
    from absl import flags

    flags.FLAGS.validate_all_flags()
