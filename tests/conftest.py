"""Shared fixtures: clean subprocess environments, loopback ports owned for a test's duration, no
leftover processes."""
import atexit
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import socket

import psutil
import pytest

from tfsync_testbed import localrun, warmpython, warmrun

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(REPO, "tests", "workers")
# Every process a test starts carries this in its environment, so that one left behind is
# found even after its parent died and it was re-parented.
OWNER_VAR, OWNER = "TFSYNCMODES_TEST_OWNER", str(os.getpid())

# One temporary directory for the whole session, made by the process that runs pytest (or
# pytest-xdist's controller) and inherited as TMPDIR by its workers and by every process a test
# starts; it is removed when that process exits. A process a test kills cannot remove its own
# temporary files (TensorFlow's autograph sources, removed at exit), so they go with it.
SESSION_TMP_VAR = "TFSYNCMODES_TEST_TMP"
if SESSION_TMP_VAR not in os.environ:
    SESSION_TMP = tempfile.mkdtemp(prefix="tfsync-tests-")
    os.environ[SESSION_TMP_VAR] = os.environ["TMPDIR"] = SESSION_TMP
    tempfile.tempdir = None  # read TMPDIR again
    atexit.register(shutil.rmtree, SESSION_TMP, True)

# The interpreter the tests start their programs with: a warm one (tfsync_testbed.warmpython:
# TensorFlow, Keras and Horovod imported once, each program a child forked from that), unless
# TFSYNCMODES_TEST_COLD=1. The tools installed beside the interpreter (horovodrun, the console
# commands) are found from COLD_PYTHON, and a test that needs a process to start cold uses it.
COLD_PYTHON = sys.executable
if os.environ.get("TFSYNCMODES_TEST_COLD") == "1":
    WARM_DIR, PYTHON = None, COLD_PYTHON
else:
    WARM_DIR = tempfile.mkdtemp(prefix="tfsync-warm-")
    atexit.register(shutil.rmtree, WARM_DIR, True)
    PYTHON = warmpython.write_launcher(WARM_DIR)
WARM_SERVERS = []


def clean_env(**extra):
    """The test process's environment without cluster or mode settings, plus `extra`.

    PYTHONPATH is the repository: that is how every process a test starts (workers in
    tests/workers/, benchmarks run as ``python -m benchmarks.NAME``) imports ``tests``,
    ``tfsync_testbed``, ``benchmarks`` and this checkout's tfsyncmodes; none of them puts a path
    on ``sys.path`` itself."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TFSYNC_", "HOROVOD_", "OMPI_", "PMI_")) and k not in ("TF_CONFIG",)}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    env[OWNER_VAR] = OWNER
    env.update({k: str(v) for k, v in extra.items()})
    return env


def trainer_runs(cases, timeout=60):
    """The example trainer's program (scripts/train.py) once per case, ``{name: (args, env)}``:
    each run a process of its own with `args` after the program's name and `env` added to
    :func:`clean_env`, forked from one process that imported the program once
    (:mod:`tfsync_testbed.warmrun`). Returns ``{name: CompletedProcess}``."""
    names = list(cases)
    runs = [{"argv": ["train.py", *cases[name][0]], "env": {k: str(v) for k, v in cases[name][1].items()}}
            for name in names]
    results = warmrun.run_cases("tfsyncmodes.examples.train:main", runs, env=clean_env(), cwd=REPO,
                                timeout=timeout)
    return dict(zip(names, results))


def check_bad_benchmark_flag(module, flag, words, docs_dir):
    """``python -m benchmarks.MODULE FLAG`` refuses it in one line naming `words`, with status
    2, and writes nothing into `docs_dir`."""
    result = subprocess.run([PYTHON, "-m", f"benchmarks.{module}", flag, f"--docs_dir={docs_dir}"],
                            capture_output=True, text=True, timeout=120, env=clean_env(), cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
    assert list(docs_dir.iterdir()) == []


def tf_config(cluster, task_type, index):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def run_checked(command, timeout, **env):
    """Runs `command` (process group killed on timeout) and fails the test with its output
    unless it exits 0."""
    result = localrun.run(command, timeout=timeout, env=clean_env(**env), cwd=REPO)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, command))} exited {result.returncode}\n"
                    f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-6000:]}")
    return result


def run_cluster(commands, timeout, env_per_task):
    """Starts one process per command (each in its own group), waits for all, kills all on
    timeout or when one fails. Returns the CompletedProcess list.

    Each process writes to a file of its own, not a pipe: a rank that prints more than a pipe
    buffer while another waits for it in a collective must not block on its output.
    """
    files = [tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") for _ in commands]
    processes = []
    try:
        for cmd, env, out in zip(commands, env_per_task, files):
            processes.append(subprocess.Popen(cmd, env=clean_env(**env), cwd=REPO, stdout=out,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in processes):
            if any(p.poll() not in (None, 0) for p in processes) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # The first to fail is the one to show; the others are then killed by us.
        failed = [i for i, p in enumerate(processes) if p.poll() not in (None, 0)]
        timed_out = any(p.poll() is None for p in processes) and not failed
    finally:
        for process in processes:
            localrun.kill_group(process)
            process.wait()
    outputs = []
    for out in files:
        out.seek(0)
        outputs.append(out.read())
        out.close()
    results = [subprocess.CompletedProcess(p.args, p.returncode, text, "")
               for p, text in zip(processes, outputs)]
    if timed_out:
        pytest.fail(f"cluster did not finish within {timeout}s:\n"
                    + "\n".join(f"--- task {i} ---\n{r.stdout[-3000:]}" for i, r in enumerate(results)))
    for index in failed:
        pytest.fail(f"task {index} exited {results[index].returncode}:\n{results[index].stdout[-6000:]}")
    return results


# TensorFlow's gRPC server binds its port with SO_REUSEPORT when this is set, so it can bind a
# port that `owned_ports` holds (also with SO_REUSEPORT, never listening).
REUSE_PORT_ENV = {"TF_GRPC_REUSE_PORT": "1"}


# Under pytest-xdist, a test marked `solo` (one that judges speed or time) runs while no other test
# does: the controller makes a folder of two lock files and passes it to every worker; each test
# takes "run" shared, a solo test takes it exclusive. "turn" is a turnstile, so that a solo test
# waiting for the others is not passed by their next tests. The locks are taken outside the
# test's timeout (this wrapper is the outermost), so waiting for one's turn is not the test's time.
SOLO_KEY = "tfsyncmodes_solo_locks"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    config = node.config
    if not hasattr(config, "tfsync_solo_locks"):
        config.tfsync_solo_locks = tempfile.mkdtemp(prefix="tfsync-solo-")
    node.workerinput[SOLO_KEY] = config.tfsync_solo_locks


def pytest_unconfigure(config):
    if hasattr(config, "tfsync_solo_locks"):
        shutil.rmtree(config.tfsync_solo_locks, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with one test queued ahead on each worker instead of pytest-xdist's
    three: when the queue of work runs dry, what a worker still holds is all it runs while the
    other may have nothing left, and here one test can take a minute."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class OneAhead(LoadGroupScheduling):
        def _reschedule(self, node):
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
            elif self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)

    return OneAhead(config, log)


@contextlib.contextmanager
def solo_turn(folder, solo):
    """Holds the run lock (exclusive if `solo`) for the block; nothing when `folder` is None."""
    if folder is None:
        yield
        return
    with open(os.path.join(folder, "turn"), "a") as turn, open(os.path.join(folder, "run"), "a") as run:
        fcntl.flock(turn, fcntl.LOCK_EX)
        fcntl.flock(run, fcntl.LOCK_EX if solo else fcntl.LOCK_SH)
        if not solo:
            fcntl.flock(turn, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)
            fcntl.flock(turn, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    folder = getattr(item.config, "workerinput", {}).get(SOLO_KEY)
    with solo_turn(folder, item.get_closest_marker("solo") is not None):
        yield


@pytest.fixture(scope="session", autouse=True)
def warm_servers():
    """The warm interpreter's servers, one for Keras 3 and one for tf_keras, started in the
    background: until one listens, its clients run their programs cold."""
    if WARM_DIR is None:
        yield
        return
    script = os.path.join(REPO, "tfsync_testbed", "warmpython.py")
    for extra in ({}, {"TF_USE_LEGACY_KERAS": "1"}):
        WARM_SERVERS.append(subprocess.Popen([COLD_PYTHON, script, "serve", WARM_DIR], env=clean_env(**extra),
                                             cwd=REPO, stdin=subprocess.DEVNULL, start_new_session=True))
    yield
    for server in WARM_SERVERS:
        server.kill()
        server.wait()


@pytest.fixture
def owned_ports():
    """``take(count)``: `count` 127.0.0.1 ports this test owns until it ends. Each is a socket
    bound with SO_REUSEPORT and held open, so no other process can bind the port (a bind
    without SO_REUSEPORT, or by another user, is refused), while the TensorFlow servers the test
    starts with ``REUSE_PORT_ENV`` bind it beside the held socket; a port no server binds is
    refused to clients (nothing listens). Nothing is picked, released and hoped for."""
    held = []

    def take(count):
        taken = []
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
            taken.append(sock.getsockname()[1])
        return taken

    yield take
    for sock in held:
        sock.close()


def owned_processes():
    owned, servers = [], {server.pid for server in WARM_SERVERS}
    for process in psutil.process_iter():
        try:
            if (process.pid not in servers and process.environ().get(OWNER_VAR) == OWNER
                    and process.status() != psutil.STATUS_ZOMBIE):
                owned.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return owned


def processes_left(seconds: float = 10.0):
    """The owned processes still running after up to `seconds` (a killed process may take a
    moment to exit on a loaded machine); [] as soon as there are none."""
    deadline = time.monotonic() + seconds
    alive = owned_processes()
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = owned_processes()
    return alive


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every test must leave no child process behind."""
    yield
    alive = processes_left()
    if not alive:
        return
    names = [f"{p.pid}:{' '.join(p.cmdline())[:80]}" for p in alive]
    for p in alive:
        p.kill()
    pytest.fail(f"processes left behind: {names}")
