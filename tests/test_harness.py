"""The test harness itself: a rank that writes a lot while another waits for it must not hang;
a case forked from a warm process, and a program run by the warm interpreter, exit, print and
fail as the same program run by Python; under two pytest-xdist workers a `solo` test runs alone
and the tests of one `xdist_group` share a worker."""
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from tests.conftest import COLD_PYTHON, PYTHON, REPO, WARM_DIR, WORKERS, clean_env, run_cluster
from tfsync_testbed import localrun, warmpython, warmrun

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


def _wait_for_warm_servers(timeout=90):
    """The warm interpreter's servers start with the session; until they listen, its clients run
    cold, which these tests must not mistake for warm."""
    deadline = time.monotonic() + timeout
    while len([n for n in os.listdir(WARM_DIR) if n.endswith(".sock")]) < 2:
        assert time.monotonic() < deadline, "the warm interpreter's servers did not start"
        time.sleep(0.2)


WARM_PYTHON_CASES = [(["exit", "0"], {}, None), (["exit", "2"], {"WARM_VALUE": "two"}, None),
                     (["message", "one", "line"], {}, None), (["raise"], {"WARM_VALUE": "raised"}, None),
                     (["where"], {}, "from stdin\n"), (["where"], {"TF_USE_LEGACY_KERAS": "1"}, "")]


@pytest.mark.skipif(WARM_DIR is None, reason="TFSYNCMODES_TEST_COLD=1: the tests run without it")
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["script", "module"])
def test_the_warm_interpreter_runs_a_program_as_python_does(how):
    """A program started through the warm interpreter (in a loopback namespace of its own where
    the machine allows, as the tests' horovodrun jobs are) against the same program started by
    Python: the same status, stdout (its argv, working directory, sys.path[0], __file__, network
    interfaces and standard input) and stderr; only the warm one found TensorFlow imported."""
    _wait_for_warm_servers()
    program = ([os.path.join(WORKERS, "warm_program.py")] if how == "script"
               else ["-m", "tests.workers.warm_program"])
    prefix = list(localrun.loopback_namespace_prefix())
    for argv, env, stdin in WARM_PYTHON_CASES:
        warm, cold = (localrun.run([*prefix, python, *program, *argv], timeout=60, env=clean_env(**env),
                                   cwd=REPO, input=stdin) for python in (PYTHON, COLD_PYTHON))
        assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout), (argv, warm.stderr)
        warm_err, cold_err = warm.stderr.splitlines(), cold.stderr.splitlines()
        assert (warm_err[0], cold_err[0]) == ("warm=True", "warm=False"), argv
        assert warm_err[1] == cold_err[1] and warm_err[-1] == cold_err[-1], argv
        assert ("Traceback" in warm.stderr) == ("Traceback" in cold.stderr) == (argv == ["raise"]), argv
        if argv == ["where"] and prefix:
            assert "network ['lo']" in warm.stdout, warm.stdout


@pytest.mark.skipif(WARM_DIR is None, reason="TFSYNCMODES_TEST_COLD=1: the tests run without it")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_the_warm_interpreters_program_dies_with_its_client(signum):
    """A signal to the client reaches the program (SIGTERM: the client then dies of it, as the
    program did); a client killed outright takes the program with it (it watches the client)."""
    _wait_for_warm_servers()
    client = subprocess.Popen([PYTHON, os.path.join(WORKERS, "warm_program.py"), "hold", "60"],
                              env=clean_env(), cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().startswith("argv")
        program = int(client.stdout.readline().split()[1])
        assert program != client.pid and psutil.pid_exists(program)
        started = time.monotonic()
        client.send_signal(signum)
        assert client.wait(timeout=10) == -signum
        while psutil.pid_exists(program) and psutil.Process(program).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() - started < 10, "the program outlived its client"
            time.sleep(0.05)
    finally:
        client.kill()
        client.wait()


@pytest.mark.skipif(WARM_DIR is None, reason="TFSYNCMODES_TEST_COLD=1: the tests run without it")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_client_whose_program_is_killed_dies_of_the_same_signal(signum):
    """The program killed by a signal sent to it, not to the client (as the chaos runs kill a
    rank): the client dies of that signal too, with no traceback of its own. SIGKILL's
    handler cannot be reset, and once the client tried: OSError, and exit status 1."""
    _wait_for_warm_servers()
    client = subprocess.Popen([PYTHON, os.path.join(WORKERS, "warm_program.py"), "hold", "60"],
                              env=clean_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert client.stdout.readline().startswith("argv")
        program = int(client.stdout.readline().split()[1])
        assert program != client.pid
        os.kill(program, signum)
        assert client.wait(timeout=10) == -signum
        assert "Traceback" not in client.stderr.read()
    finally:
        client.kill()
        client.wait()


SOLO_TESTS = '''
import os, time
import pytest

def _record(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    with open(os.path.join(os.environ["SPANS"], name), "w") as out:
        out.write(f"{start} {time.monotonic()}")

@pytest.mark.solo
def test_solo():
    _record("solo", 1.5)

@pytest.mark.parametrize("k", range(6))
def test_other(k):
    _record(f"other{k}", 0.6)

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("k", range(4))
def test_grouped(k):
    with open(os.path.join(os.environ["SPANS"], f"worker{k}"), "w") as out:
        out.write(os.environ["PYTEST_XDIST_WORKER"])
'''


@pytest.mark.timeout(180)
def test_a_solo_test_runs_while_no_other_does_on_two_workers(tmp_path):
    """tests/conftest.py's `solo` lock, in a pytest run of its own on two xdist workers: the
    other tests run two at a time, but none while the solo test runs. And `--dist loadgroup`
    runs the tests of one `xdist_group` on one worker (what the shared jobs rely on), with
    the conftest's scheduler (one test queued ahead on each worker)."""
    pytest.importorskip("xdist")
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_configure_node, pytest_runtest_protocol, pytest_unconfigure, "
        "pytest_xdist_make_scheduler\n")
    (tmp_path / "test_spans.py").write_text(SOLO_TESTS)
    spans = tmp_path / "spans"
    spans.mkdir()
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "tfsync-solo-*")))
    result = subprocess.run([COLD_PYTHON, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:randomly",
                             "-p", "no:cacheprovider",
                             "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_spans.py")],
                            cwd=tmp_path, env=clean_env(SPANS=spans), capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    workers = {path.read_text() for path in spans.glob("worker*")}
    assert len(list(spans.glob("worker*"))) == 4 and len(workers) == 1, workers
    got = {path.name: tuple(map(float, path.read_text().split())) for path in spans.iterdir()
           if not path.name.startswith("worker")}
    assert len(got) == 7, sorted(got)
    solo = got.pop("solo")
    overlapping = [name for name, (start, end) in got.items() if start < solo[1] and end > solo[0]]
    assert not overlapping, (solo, got)
    pairs = [(a, b) for a in got for b in got if a < b and got[a][0] < got[b][1] and got[b][0] < got[a][1]]
    assert pairs, got  # the others did run two at a time: the check above could have failed
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "tfsync-solo-*"))) <= before  # its locks removed


def test_the_warm_interpreter_keys_its_servers_by_what_the_import_reads():
    """A program with TF_USE_LEGACY_KERAS=0 imports Keras 3, as with it unset (TensorFlow takes
    only true, True or 1): both reach the Keras 3 server, and tf_keras's is another."""
    keras3 = warmpython.socket_path("d", {"PYTHONPATH": REPO})
    for value in ("0", "", "false"):
        assert warmpython.socket_path("d", {"PYTHONPATH": REPO, "TF_USE_LEGACY_KERAS": value}) == keras3
    for value in ("1", "true", "True"):
        assert warmpython.socket_path("d", {"PYTHONPATH": REPO, "TF_USE_LEGACY_KERAS": value}) != keras3
    assert warmpython.socket_path("d", {"PYTHONPATH": "elsewhere"}) != keras3
