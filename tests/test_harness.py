"""The test harness itself: a rank that writes a lot while another waits for it must not hang;
a case forked from a warm process exits, prints and fails as the same program run whole."""
import os
import sys
import time

import pytest

from tests.conftest import REPO, WORKERS, clean_env, run_cluster
from tfsync_testbed import localrun, warmrun

# Task 1 writes far more than a pipe buffer (64 KiB) before it lets task 0 go on, as a rank
# that logs a lot does while the chief waits for it in a collective.
CHATTY = "import sys\nsys.stdout.write('x' * 1_000_000 + '\\n'); sys.stdout.flush()\nopen(sys.argv[1], 'w').close()\n"
WAITING = ("import os, sys, time\n"
           "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
           "print('chief done')\n")


@pytest.mark.timeout(60)
def test_run_cluster_reads_every_task_while_they_run(tmp_path):
    flag = str(tmp_path / "released")
    results = run_cluster([[sys.executable, "-c", WAITING, flag], [sys.executable, "-c", CHATTY, flag]],
                          timeout=30, env_per_task=[{}, {}])
    assert results[0].stdout.strip() == "chief done"
    assert len(results[1].stdout) == 1_000_001


@pytest.mark.timeout(60)
def test_run_cluster_stops_the_others_when_one_fails():
    waits = [sys.executable, "-c", "import time; time.sleep(300)"]
    fails = [sys.executable, "-c", "import sys; print('bad input'); sys.exit(3)"]
    with pytest.raises(pytest.fail.Exception, match=r"task 1 exited 3:\nbad input"):
        run_cluster([waits, fails], timeout=40, env_per_task=[{}, {}])


WARM_CASES = [(["exit", "0"], {}), (["exit", "2"], {"WARM_VALUE": "two"}), (["message", "one", "line"], {}),
              (["raise"], {"WARM_VALUE": "raised"}), (["sleep", "0.1"], {})]


@pytest.mark.timeout(120)
def test_a_warm_run_is_the_program_run_whole():
    """Each case forked from one process that imported the program, against the same program
    started as a process of its own: the same status, stdout and stderr (a traceback included)."""
    program = os.path.join(WORKERS, "warm_program.py")
    warm = warmrun.run_cases("tests.workers.warm_program:main",
                             [{"argv": [program, *argv], "env": env} for argv, env in WARM_CASES],
                             env=clean_env(), cwd=REPO, timeout=30)
    for (argv, env), got in zip(WARM_CASES, warm):
        whole = localrun.run([sys.executable, program, *argv], timeout=30,
                             env=clean_env(**env), cwd=REPO)
        assert (got.returncode, got.stdout) == (whole.returncode, whole.stdout), argv
        # A traceback names the file it ran from; the last line (the exception) is the same.
        assert got.stderr.splitlines()[0] == whole.stderr.splitlines()[0], argv
        assert got.stderr.splitlines()[-1] == whole.stderr.splitlines()[-1], argv
        assert ("Traceback" in got.stderr) == ("Traceback" in whole.stderr) == (argv == ["raise"]), argv
    assert [r.returncode for r in warm] == [0, 2, 1, 1, 0]


@pytest.mark.timeout(120)
def test_a_warm_run_kills_a_case_at_its_timeout_and_refuses_import_time_settings():
    started = time.monotonic()
    slow, quick = warmrun.run_cases("tests.workers.warm_program:main",
                                    [{"argv": ["p", "sleep", "60"]}, {"argv": ["p", "exit", "3"]}],
                                    env=clean_env(), cwd=REPO, timeout=2)
    assert slow.returncode == "timeout" and quick.returncode == 3
    assert time.monotonic() - started < 30
    with pytest.raises(ValueError, match="TF_USE_LEGACY_KERAS"):
        warmrun.run_cases("tests.workers.warm_program:main",
                          [{"argv": ["p", "exit", "0"], "env": {"TF_USE_LEGACY_KERAS": "1"}}],
                          env=clean_env(TF_USE_LEGACY_KERAS="0"), cwd=REPO, timeout=2)
