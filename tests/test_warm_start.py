"""Warm joins (tfsyncmodes_warm): the ranks of a real ``horovodrun`` job are children forked
from one server per job and host that imported TensorFlow, Keras and Horovod before they
started; each runs the program it was given, in its launched process's environment and working
directory, and that process exits with its status; the server leaves with the job. Outside
``horovodrun`` the program runs as ``python`` runs it. (The elastic job that loses ranks and
takes them back warm is in tests/test_chaos.py.)"""
import json
import os
import subprocess
import time

import psutil
import pytest

from tests.conftest import COLD_PYTHON, PYTHON, REPO, WORKERS, clean_env
from tfsync_testbed import localrun

PROBE = os.path.join(WORKERS, "warm_probe.py")


def results(stdout):
    return sorted((json.loads(line.split("RESULT ", 1)[1]) for line in stdout.splitlines() if "RESULT " in line),
                  key=lambda r: r["rank"])


def gone(pid, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.timeout(180)
def test_every_rank_is_forked_from_one_server_that_imported_tensorflow_and_the_server_leaves_with_the_job():
    command = localrun.horovodrun_command(3, [PYTHON, "-m", "tfsyncmodes_warm", PROBE, "0", "0", "0"])
    result = localrun.run(command, timeout=150, env=clean_env(WARM_PROBE_MARK="m1"), cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = results(result.stdout)
    assert [r["rank"] for r in ranks] == [0, 1, 2], result.stdout[-3000:]
    assert {r["parent"] for r in ranks} == {ranks[0]["parent"]}  # one server, a child each
    server = ranks[0]["parent_command"]
    assert server[1:] == [os.path.join(REPO, "tfsyncmodes_warm.py"), "--serve"], server
    for rank in ranks:
        assert rank["preimported"] == ["horovod.tensorflow", "keras", "tensorflow"], rank
        assert (rank["argv"], rank["cwd"], rank["mark"], rank["main"]) == (["0", "0", "0"], REPO, "m1", "__main__")
    assert "starting without a warm server" not in result.stderr
    assert gone(ranks[0]["parent"]), "the warm server outlived its job"


@pytest.mark.timeout(180)
def test_a_ranks_exit_status_is_the_launched_process_status():
    command = localrun.horovodrun_command(2, [PYTHON, "-m", "tfsyncmodes_warm", PROBE, "0", "3"])
    result = localrun.run(command, timeout=150, env=clean_env(WARM_PROBE_MARK="m2"), cwd=REPO)
    assert result.returncode != 0
    assert "Exit code: 3" in result.stdout + result.stderr, (result.stdout + result.stderr)[-3000:]
    ranks = results(result.stdout)
    assert ranks and all(r["parent_command"][-1] == "--serve" for r in ranks), ranks
    assert all(gone(r["parent"]) for r in ranks)


def test_outside_horovodrun_the_program_runs_as_python_runs_it():
    result = subprocess.run([COLD_PYTHON, "-m", "tfsyncmodes_warm", PROBE, "4"], capture_output=True, text=True,
                            timeout=60, env=clean_env(WARM_PROBE_MARK="m3"), cwd=REPO)
    assert result.returncode == 4, result.stderr
    (rank,) = results(result.stdout)
    assert rank["preimported"] == [] and rank["mark"] == "m3" and rank["argv"] == ["4"], rank


def test_no_program_is_one_line_and_status_2():
    result = subprocess.run([COLD_PYTHON, "-m", "tfsyncmodes_warm"], capture_output=True, text=True,
                            timeout=60, env=clean_env(), cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "tfsyncmodes_warm: no program given; fix:" in result.stderr


def test_the_client_imports_no_tensorflow():
    result = subprocess.run([COLD_PYTHON, "-c", "import sys, tfsyncmodes_warm; print(sorted(m for m in sys.modules "
                             "if m.split('.')[0] in ('tensorflow', 'keras', 'horovod', 'tfsyncmodes')))"],
                            capture_output=True, text=True, timeout=60, env=clean_env(), cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


@pytest.mark.parametrize("value", ["soon", "-1", "0", "nan"])
def test_a_bad_idle_time_is_one_line_and_status_2(value):
    result = subprocess.run([COLD_PYTHON, "-m", "tfsyncmodes_warm", PROBE], capture_output=True, text=True,
                            timeout=60, env=clean_env(TFSYNC_WARM_IDLE=value), cwd=REPO)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"tfsyncmodes_warm: TFSYNC_WARM_IDLE={value!r} is not a number of seconds; "
                             "fix: a number > 0, e.g. TFSYNC_WARM_IDLE=60\n")
