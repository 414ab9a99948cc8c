"""The test harness itself: a rank that writes a lot while another waits for it must not hang."""
import sys

import pytest

from tests.conftest import run_cluster

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
