"""Bad input on the command line: one clear line, exit status 2, no traceback, no hang."""
import os
import time

import pytest

from tests.conftest import PYTHON, REPO, REUSE_PORT_ENV, clean_env, tf_config, trainer_runs
from tfsync_testbed import localrun

TRAIN = os.path.join(REPO, "scripts", "train.py")
# Creating the strategy and the watchdog, and start-up time varying between two runs.
SLACK_SECONDS = 15


def run_train(args, timeout=90, **env):
    """train.py; a TensorFlow server it starts binds a port the test owns (``owned_ports``)."""
    return localrun.run([PYTHON, TRAIN, "--epochs=1", *args], timeout=timeout,
                        env=clean_env(**REUSE_PORT_ENV, **env),
                        cwd=REPO)


def assert_one_clear_error(result, *words, status=2):
    """One `tfsyncmodes: error:` line naming `words`, no traceback, and exit status `status`
    (2: bad input; None: any failure)."""
    if status is None:
        assert result.returncode != 0, result.stdout
    else:
        assert result.returncode == status, (result.returncode, result.stdout[-2000:], result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("tfsyncmodes: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    for word in words:
        assert word in errors[0]


def worker_tf_config(take, *extra_roles):
    ports = take(2 + len(extra_roles))
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports[:2]]}
    for role, port in zip(extra_roles, ports[2:]):
        cluster[role] = [f"127.0.0.1:{port}"]
    return cluster


# Refused before any server starts: each case a process of its own, forked from one that imported
# the trainer once (conftest.trainer_runs).
REFUSALS = {
    "flag-mode": (["--sync_mode=bogus"], {}, ["--sync_mode", "'bogus'", "sync, async, hybrid"]),
    "env-mode": ([], {"TFSYNC_MODE": "bogus"}, ["TFSYNC_MODE", "sync, async, hybrid"]),
    "backend": (["--sync_backend=gpu"], {}, ["--sync_backend", "auto, horovod, multi_worker, mirrored"]),
    "old-sentinel": (["--sync_max_staleness=-1"], {}, [
        "flag: --sync_max_staleness: '-1' is not accepted any more (it meant off); "
        "use off or an integer in [0, 1073741824]"]),
    "missing-config": (["--sync_config=/nonexistent/sync.yaml"], {},
                       ["--sync_config", "/nonexistent/sync.yaml does not exist"]),
    "config-unknown-key": (["--sync_config=tests/data/unknown_key.yaml"], {},
                           ["bakend", "unknown key", "mode, backend"]),
    "config-directory": (["--sync_config=tests/data"], {},
                         ["flag: --sync_config: tests/data is a directory, not a file; give an existing YAML file"]),
    "config-not-utf8": (["--sync_config=tests/data/not_utf8.yaml"], {},
                        ["config file tests/data/not_utf8.yaml: (yaml): is not UTF-8 text (byte 0); save it as UTF-8"]),
    "horovod-without-horovodrun": (["--sync_backend=horovod"], {},
                                   ["flag: --sync_backend: horovod: this process was not started by horovodrun; "
                                    "launch with: horovodrun -np"]),
    "env-horovod-without-horovodrun": ([], {"TFSYNC_BACKEND": "horovod"},
                                       ["environment: TFSYNC_BACKEND: horovod: this process was not started"]),
    "hybrid-without-horovodrun": (["--sync_mode=hybrid"], {},
                                  ["flag: --sync_mode: hybrid: this process was not started by horovodrun"]),
    "multi-worker-without-tf-config": (["--sync_backend=multi_worker"], {}, ["multi_worker", "TF_CONFIG is not set"]),
    "bad-json": ([], {"TF_CONFIG": "{oops"}, ["TF_CONFIG", "not valid JSON"]),
    "missing-task": ([], {"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}}'}, ["TF_CONFIG: task"]),
    "index-range": ([], {"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
                                      '"task": {"type": "worker", "index": 5}}'}, ["task.index", "0..1"]),
    "async-unset": (["--sync_mode=async"], {}, ["TF_CONFIG", "needs a cluster with chief, worker and ps",
                                                 "tfsyncmodes.launch"]),
    "async-role-twice": (["--sync_mode=async"], {
        "TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, '
                     '"task": {"type": "worker", "index": 0}}'}, ["TF_CONFIG", "worker", "is given twice"]),
}


@pytest.fixture(scope="module")
def refusals():
    return trainer_runs({name: (["--epochs=1", *args], {**REUSE_PORT_ENV, **env})
                         for name, (args, env, _) in REFUSALS.items()})


@pytest.mark.timeout(600)
@pytest.mark.xdist_group("trainer-refusals")  # one worker runs the module's sweep once
@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_bad_input_gives_one_line(name, refusals):
    assert_one_clear_error(refusals[name], *REFUSALS[name][2])


@pytest.mark.timeout(120)
def test_ps_role_is_refused_in_sync_mode(owned_ports):
    cluster = worker_tf_config(owned_ports, "ps")
    result = run_train([], TF_CONFIG=tf_config(cluster, "worker", 0))
    assert_one_clear_error(result, "cluster.ps", "not used by --sync_mode=sync")


@pytest.mark.timeout(240)
def test_missing_worker_fails_within_the_collective_timeout(owned_ports):
    cluster = worker_tf_config(owned_ports)
    # Starting Python, TensorFlow and the script, as long as it takes on this machine now:
    # a run that stops at the configuration, before any waiting.
    started = time.monotonic()
    assert_one_clear_error(run_train(["--sync_mode=bogus"]), "--sync_mode")
    startup = time.monotonic() - started
    started = time.monotonic()
    result = run_train([], timeout=100, TF_CONFIG=tf_config(cluster, "worker", 0),
                       TFSYNC_COLLECTIVE_TIMEOUT="8")
    elapsed = time.monotonic() - started
    # The process is stuck inside TensorFlow's C++ (it ignores SIGTERM); the watchdog's SIGINT
    # runs _exit(2) there: the one line, then exit status 2 (not 137, a SIGKILL).
    assert_one_clear_error(result, "connecting to the TF_CONFIG workers", "within 8s", cluster["worker"][1])
    # The 8 s are waited, and not much more than that beyond the start-up.
    assert elapsed >= 8 and elapsed - startup < 8 + SLACK_SECONDS, (elapsed, startup)


def async_cluster(take, *roles):
    ports = iter(take(len(roles)))
    cluster = {}
    for role in roles:
        cluster.setdefault(role, []).append(f"127.0.0.1:{next(ports)}")
    return cluster


@pytest.mark.timeout(300)
@pytest.mark.parametrize("tf_config_text, words", [
    (lambda take: tf_config(async_cluster(take, "chief", "worker"), "chief", 0), ["cluster.ps", "needs at least one 'ps'"]),
    (lambda take: tf_config(async_cluster(take, "chief", "ps"), "chief", 0), ["cluster.worker", "needs at least one 'worker'"]),
], ids=["no-ps", "no-worker"])
def test_async_cluster_errors(tf_config_text, words, owned_ports):
    assert_one_clear_error(run_train(["--sync_mode=async"], TF_CONFIG=tf_config_text(owned_ports)), *words)


@pytest.mark.timeout(120)
def test_async_refuses_sharding_under_keras3(owned_ports):
    cluster = async_cluster(owned_ports, "chief", "worker", "ps", "ps")
    result = run_train(["--sync_mode=async", "--sync_ps_shards=2"], TF_CONFIG=tf_config(cluster, "chief", 0),
                       TFSYNC_COLLECTIVE_TIMEOUT="20")
    assert_one_clear_error(result, "ps_shards", "Keras 3", "TF_USE_LEGACY_KERAS=1")
