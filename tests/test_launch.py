"""The local cluster launcher: TF_CONFIG per task, prefixed output, teardown in every case."""
import json
import os
import signal
import subprocess
import time

import pytest

from tests.conftest import PYTHON, REPO, WORKERS, clean_env
from tfsync_testbed import localrun

STAND_IN = os.path.join(WORKERS, "stand_in_task.py")  # a task that listens and leaves as ours do


def launch(*args, chief_seconds=1.0, chief_status=0, worker_dies_after=-1.0, ps_dies_after=-1.0, timeout=60):
    command = [PYTHON, "-m", "tfsyncmodes.launch", *args, "--", PYTHON, STAND_IN,
               str(chief_seconds), str(chief_status), str(worker_dies_after), str(ps_dies_after)]
    return localrun.run(command, timeout=timeout, env=clean_env(), cwd=REPO)


def task_lines(stdout):
    return [l for l in stdout.splitlines() if " task " in l]


@pytest.mark.slow  # a launched cluster of processes
@pytest.mark.timeout(90)
def test_one_tf_config_per_task_on_loopback_and_the_chief_status():
    result = launch("--workers", "2", "--ps", "1", chief_status=5)
    assert result.returncode == 5, result.stdout
    lines = task_lines(result.stdout)
    assert sorted(l.split(" task ")[0] for l in lines) == ["[chief:0]", "[ps:0]", "[worker:0]", "[worker:1]"]
    clusters = {l.split(" ", 4)[4] for l in lines}
    assert len(clusters) == 1
    cluster = json.loads(clusters.pop())
    addresses = [a for role in ("chief", "worker", "ps") for a in cluster[role]]
    assert len(addresses) == 4 == len(set(addresses))
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    for line in lines:
        prefix, _, rest = line.partition(" task ")
        role, index = rest.split()[:2]
        assert prefix == f"[{role}:{index}]"


@pytest.mark.slow  # a launched cluster of processes
@pytest.mark.timeout(90)
def test_a_dying_worker_stops_the_cluster_unless_tolerated():
    result = launch("--workers", "2", "--ps", "1", chief_seconds=30, worker_dies_after=1)
    assert result.returncode == 1
    assert "[launch] worker:1 exited with status 7; stopping the cluster" in result.stdout
    tolerated = launch("--workers", "2", "--ps", "1", "--tolerate_worker_loss", chief_seconds=3,
                       worker_dies_after=0.5)
    assert tolerated.returncode == 0
    assert "[launch] worker:1 exited with status 7; the others go on" in tolerated.stdout


@pytest.mark.slow  # a launched cluster of processes
@pytest.mark.timeout(120)
def test_max_restarts_restarts_a_worker_at_its_address_then_stops():
    result = launch("--workers", "2", "--ps", "1", "--max_restarts", "2", chief_seconds=30, worker_dies_after=0.5,
                    timeout=100)
    assert result.returncode == 1, result.stdout
    said = [l for l in result.stdout.splitlines() if l.startswith("[launch] worker:1 exited")]
    address = json.loads(task_lines(result.stdout)[0].split(" ", 4)[4])["worker"][1]
    assert said == [f"[launch] worker:1 exited with status 7; restarting it at {address} (restart 1 of 2)",
                    f"[launch] worker:1 exited with status 7; restarting it at {address} (restart 2 of 2)",
                    "[launch] worker:1 exited with status 7; stopping the cluster"], result.stdout
    # Three runs of worker:1, all in the one cluster (the same addresses); the others ran once.
    assert [l.split(" task ")[0] for l in task_lines(result.stdout)].count("[worker:1]") == 3
    assert len({l.split(" ", 4)[4] for l in task_lines(result.stdout)}) == 1


@pytest.mark.slow  # a launched cluster of processes
@pytest.mark.timeout(180)
@pytest.mark.parametrize("who", ["ps", "chief"])
def test_max_restarts_starts_the_cluster_again_when_a_ps_or_the_chief_dies(who):
    kwargs = {"ps_dies_after": 0.5, "chief_seconds": 30} if who == "ps" else {"chief_status": 5}
    result = launch("--workers", "1", "--ps", "1", "--max_restarts", "1", timeout=150, **kwargs)
    lost, status = ("ps:0", 9) if who == "ps" else ("chief:0", 5)
    assert result.returncode == (1 if who == "ps" else 5), result.stdout
    assert (f"[launch] {lost} exited with status {status}; restarting the cluster, the chief resumes from "
            "its last backup (restart 1 of 1)") in result.stdout
    assert result.stdout.count("[launch] cluster {") == 2  # fresh ports the second time
    assert [l.split(" task ")[0] for l in task_lines(result.stdout)].count("[chief:0]") == 2


@pytest.mark.slow  # a launched cluster of processes
@pytest.mark.timeout(120)
def test_a_chief_that_exits_2_for_bad_input_is_not_restarted():
    result = launch("--workers", "1", "--ps", "1", "--max_restarts", "3", chief_status=2)
    assert result.returncode == 2 and "restarting" not in result.stdout, result.stdout


@pytest.mark.slow  # a launched cluster of processes
@pytest.mark.timeout(90)
def test_timeout_tears_everything_down():
    started = time.monotonic()
    result = launch("--workers", "1", "--ps", "1", "--timeout", "2", chief_seconds=300)
    assert result.returncode == 124
    assert "[launch] timeout after 2s" in result.stdout
    assert time.monotonic() - started < 40


@pytest.mark.slow  # a launched cluster of processes
@pytest.mark.timeout(90)
def test_ctrl_c_tears_everything_down():
    command = [PYTHON, "-m", "tfsyncmodes.launch", "--workers", "1", "--ps", "1", "--", PYTHON, STAND_IN,
               "300", "0", "-1", "-1"]
    process = subprocess.Popen(command, env=clean_env(), cwd=REPO, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        seen = []
        deadline = time.monotonic() + 45
        while len(task_lines("".join(seen))) < 3:
            line = process.stdout.readline()
            if not line or time.monotonic() > deadline:  # EOF: the launcher ended early
                localrun.kill_group(process)
                pytest.fail(f"the tasks did not all start (exit status {process.wait()}):\n"
                            + "".join(seen) + process.stdout.read())
            seen.append(line)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=40) == 130
    finally:
        localrun.kill_group(process)
        process.wait()


@pytest.mark.timeout(120)
def test_missing_command_is_a_clear_usage_error():
    # `-m tfsyncmodes.launch` imports the package, and with it TensorFlow: on a loaded machine
    # that alone can take half a minute.
    result = localrun.run([PYTHON, "-m", "tfsyncmodes.launch", "--workers", "2"], timeout=100, env=clean_env(),
                          cwd=REPO)
    assert result.returncode == 2
    assert "command: missing; give it after --" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(60)
def test_a_negative_max_restarts_is_one_line_and_status_2():
    """Run by path, the launcher imports no TensorFlow: bad options fail at once."""
    result = localrun.run([PYTHON, f"{REPO}/tfsyncmodes/launch.py", "--max_restarts", "-1", "--", "true"],
                          timeout=50, env=clean_env(), cwd=REPO)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "tfsyncmodes: error: launch: --max_restarts: -1 is negative; use 0 (no restarts) or more"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("given, seen", [(None, "use_caller"), ("false", "false")])
def test_every_task_fails_its_rpcs_fast_unless_the_user_said_otherwise(given, seen):
    env = clean_env(**({} if given is None else {"GRPC_FAIL_FAST": given}))
    command = [PYTHON, "-m", "tfsyncmodes.launch", "--workers", "1", "--ps", "1", "--", "sh", "-c",
               'echo "fail fast: ${GRPC_FAIL_FAST:-unset}"; sleep 1']
    result = localrun.run(command, timeout=60, env=env, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = sorted(l for l in result.stdout.splitlines() if "fail fast:" in l)
    assert lines == [f"[{task}] fail fast: {seen}" for task in ("chief:0", "ps:0", "worker:0")]
