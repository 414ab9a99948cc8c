"""Every mode across 2 hosts: network namespaces on a private bridge (tfsync_testbed.netns),
each run checked like its single-host twin (same NumPy references, same bars).

Only the namespaces' own addresses (10.213.77.0/24, on a bridge the test creates and removes)
are ever targeted. Tests skip, saying why, where the bed cannot be built by design (not root,
or `ip` or `tc` not installed) or OpenSSH is not installed; as root with those tools, a bed that
fails to build fails the test (host_bed).
"""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from tests.conftest import PYTHON, REPO, WORKERS, clean_env, tf_config
from tests.test_hybrid import SCENARIOS, check_against_numpy
from tests.test_sync_horovod import check_mean_gradient_training, load_workers
from tfsync_testbed import localrun, netns, ssh

# Namespace hosts and their addresses are the machine's: one such test at a time (pytest-xdist).
pytestmark = pytest.mark.xdist_group("namespace-hosts")

TRAIN = os.path.join(REPO, "scripts", "train.py")
STEPS_PER_EPOCH = 1437 // 64


def why_no_bed():
    """Why this machine cannot have a bed by design (None: it can): not root, no `ip`, or no
    `tc` (the bed's link shaping)."""
    reason = netns.why_unavailable()
    if reason is None and shutil.which("tc") is None:
        reason = "the `tc` command (iproute2) is not installed"
    return reason


@contextlib.contextmanager
def host_bed(count=2):
    """A bed of `count` hosts; skips where the machine cannot have one (why_no_bed), and fails
    when it should and does not build: as root with `ip` and `tc`, that is a broken bed."""
    reason = why_no_bed()
    if reason:
        pytest.skip(f"no multi-host test bed here: {reason}")
    try:
        with netns.HostBed(count) as made:
            yield made
    except netns.HostBedUnavailable as why:
        pytest.fail(f"the multi-host test bed did not build, as root with ip and tc: {why}")


@pytest.fixture
def bed():
    with host_bed(2) as made:
        yield made


@pytest.fixture
def mesh(bed, tmp_path):
    reason = ssh.why_unavailable()
    if reason:
        pytest.skip(reason)
    with ssh.SshMesh(bed, tmp_path) as made:
        yield made


class Task:
    """A process on a host, its output collected line by line."""

    def __init__(self, host, name, command, **env):
        self.name = name
        self.lines = []
        self.process = host.popen(command, env=clean_env(**env), cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, errors="replace")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self):
        return "\n".join(self.lines)

    def wait(self, timeout):
        try:
            self.process.wait(timeout=timeout)
        finally:
            localrun.kill_group(self.process)
        self._reader.join(timeout=5)
        return self.process.returncode


def wait_for(task, pattern, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and task.process.poll() is None:
        if any(re.search(pattern, line) for line in task.lines):
            return
        time.sleep(0.2)
    pytest.fail(f"{task.name}: no line matching {pattern!r} within {timeout}s:\n{task.output[-5000:]}")


def run_all(tasks, timeout):
    """Waits for every task; fails with the outputs if one does not finish or exits non-zero."""
    deadline = time.monotonic() + timeout
    try:
        codes = [task.wait(max(1.0, deadline - time.monotonic())) for task in tasks]
    except subprocess.TimeoutExpired:
        pytest.fail("tasks did not finish in time:\n" + "\n".join(f"--- {t.name}\n{t.output[-3000:]}" for t in tasks))
    for task, code in zip(tasks, codes):
        assert code == 0, f"{task.name} exited {code}:\n{task.output[-5000:]}"


# --- the test bed itself ------------------------------------------------------------------

def test_hosts_reach_each_other_and_nothing_is_left_behind():
    with host_bed(2) as bed:
        a, b = bed.hosts
        namespaces = [h.namespace for h in bed.hosts]
        assert (a.address, b.address) == ("10.213.77.1", "10.213.77.2")
        server = b.popen([PYTHON, "-c", "import socket, sys; s = socket.create_server((sys.argv[1], 5000)); "
                          "c, _ = s.accept(); c.sendall(c.recv(64).upper())", b.address],
                         stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while f"{b.address}:5000" not in b.listening() and time.monotonic() < deadline:
            time.sleep(0.1)
        reply = a.run([PYTHON, "-c", "import socket, sys; c = socket.create_connection((sys.argv[1], 5000), "
                       "timeout=10); c.sendall(b'hello'); print(c.recv(64).decode())", "hostB"], timeout=30)
        assert reply.returncode == 0 and reply.stdout.strip() == "HELLO", reply
        server.wait(timeout=10)
        # Each host has its own name, resolving to its own address; the bridge has no address
        # in the machine's own namespace, so nothing outside the hosts reaches the subnet.
        names = a.run(["sh", "-c", "hostname; getent hosts hostA hostB"], timeout=20).stdout.split()
        assert names == ["hostA", "10.213.77.1", "hostA", "10.213.77.2", "hostB"]
        own = subprocess.run(["ip", "-o", "addr"], stdout=subprocess.PIPE, text=True, check=True).stdout
        assert netns.SUBNET not in own
        sleeper = b.popen(["sleep", "600"])
    assert sleeper.wait(timeout=10) == -signal.SIGKILL  # processes on a host end with it
    listed = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    assert not any(n in listed for n in namespaces)
    assert subprocess.run(["ip", "link", "show", bed.bridge], capture_output=True).returncode != 0
    assert not os.path.exists(os.path.join(netns.ETC_NETNS, namespaces[0]))


def bed_owner() -> subprocess.Popen:
    """A process that makes a 2-host bed, starts `sleep 600` on its second host, prints that
    host's namespace, the bridge and the sleeper's pid, and sleeps."""
    if why_no_bed():
        pytest.skip(why_no_bed())
    return subprocess.Popen([PYTHON, "-c", "import time; "
                             "from tfsync_testbed import netns; bed = netns.HostBed(2).__enter__(); "
                             "p = bed.hosts[1].popen(['sleep', '600']); "
                             "print(bed.hosts[1].namespace, bed.bridge, p.pid, flush=True); time.sleep(600)"],
                            stdout=subprocess.PIPE, text=True, env=clean_env())  # PYTHONPATH: the repo


@pytest.mark.timeout(120)
def test_a_bed_whose_owner_was_killed_is_removed_by_the_next():
    owner = bed_owner()
    try:
        namespace, bridge, _ = owner.stdout.readline().split()
    finally:
        owner.kill()  # as a test timeout would: no cleanup code runs
        owner.wait()
    assert namespace in subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    removed = netns.remove_stale_beds()
    assert namespace in removed and bridge in removed
    assert namespace not in subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout


@pytest.mark.timeout(120)
def test_a_bed_whose_owner_gets_sigterm_removes_itself_and_its_processes():
    owner = bed_owner()
    try:
        namespace, bridge, sleeper = owner.stdout.readline().split()
        owner.terminate()  # as a timeout wrapper or a job scheduler stops a run
        status = owner.wait(timeout=60)
    finally:
        owner.kill()
        owner.wait()
    assert status == 128 + signal.SIGTERM, status
    assert namespace not in subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    assert bridge not in subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], stdout=subprocess.PIPE,
                                        text=True).stdout
    try:  # gone, or a zombie waiting for its new parent to reap it
        state = open(f"/proc/{sleeper}/stat", encoding="utf-8").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z"), f"the process started on the bed is still running ({state})"


# --- what listens where ------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_tensorflow_servers_listen_on_every_interface_so_local_launches_get_a_private_network(bed, tmp_path):
    a, _ = bed.hosts
    # A TensorFlow gRPC server told 10.213.77.1:2222 listens on all of the host's interfaces:
    # TensorFlow has no option to bind one address.
    server = Task(a, "server", [PYTHON, "-c", "import tensorflow as tf, time; tf.distribute.Server("
                                "tf.train.ClusterSpec({'worker': ['10.213.77.1:2222']}), job_name='worker', "
                                "task_index=0, start=True); print('up', flush=True); time.sleep(300)"])
    wait_for(server, "^up$", 90)
    assert set(a.listening()) & {"*:2222", "0.0.0.0:2222", "[::]:2222"}, a.listening()
    localrun.kill_group(server.process)
    server.wait(10)
    # Hence the launcher runs a local cluster in a namespace of its own with loopback only:
    # each task sees just `lo`, and the machine's own namespace has none of its ports.
    report = ("import json, os, socket, subprocess, time\n"
              "c = json.loads(os.environ['TF_CONFIG']); t = c['task']\n"
              "print('task', t['type'], [n for _, n in socket.if_nameindex()], flush=True)\n"
              "s = socket.socket(); s.bind(('', int(c['cluster'][t['type']][t['index']].split(':')[1]))); s.listen()\n"
              "time.sleep(4 if t['type'] == 'chief' else 60)\n")
    launch = subprocess.Popen([PYTHON, "-m", "tfsyncmodes.launch", "--workers", "1", "--ps", "1", "--", PYTHON,
                               "-c", report], env=clean_env(), cwd=REPO, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        lines = []
        while len([l for l in lines if " task " in l]) < 3:
            lines.append(launch.stdout.readline())
            assert lines[-1], "".join(lines)
        cluster = json.loads(next(l for l in lines if l.startswith("[launch] cluster ")).split(" ", 2)[2])
        ports = {a.rsplit(":", 1)[1] for role in cluster.values() for a in role}
        listening_here = {address.rsplit(":", 1)[1] for address in netns.listening()}
        assert not ports & listening_here
        assert all(l.rstrip().endswith("['lo']") for l in lines if " task " in l), lines
        assert "[launch] network: a namespace of its own with loopback only" in "".join(lines)
        assert launch.wait(timeout=60) == 0
    finally:
        localrun.kill_group(launch)
        launch.wait()


# --- every mode across 2 hosts -----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_async_across_hosts_survives_losing_the_worker_on_host_b(bed, tmp_path):
    a, b = bed.hosts
    epochs = 8
    cluster = {"chief": [f"{a.address}:2222"], "ps": [f"{a.address}:2223"],
               "worker": [f"{a.address}:2224", f"{b.address}:2222"]}
    command = [PYTHON, TRAIN, "--sync_mode=async", f"--epochs={epochs}", f"--model_dir={tmp_path / 'run'}",
               f"--metrics_file={tmp_path / 'metrics.json'}"]
    placement = [("ps", 0, a), ("worker", 0, a), ("worker", 1, b), ("chief", 0, a)]
    tasks = {f"{role}:{index}": Task(host, f"{role}:{index}", command, TF_CONFIG=tf_config(cluster, role, index),
                                     GRPC_FAIL_FAST="use_caller") for role, index, host in placement}
    chief, lost = tasks["chief:0"], tasks["worker:1"]
    try:
        wait_for(chief, r"Epoch 3/", 200)
        localrun.kill_group(lost.process)  # the worker on host B dies mid-run
        survivors = [t for name, t in tasks.items() if name != "worker:1"]
        run_all(survivors, timeout=220)
    finally:
        for task in tasks.values():
            localrun.kill_group(task.process)
    assert lost.wait(5) == -signal.SIGKILL
    assert f"worker:1 at {b.address}:2222" in chief.output and "was lost" in chief.output, chief.output[-4000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["backend"] == "parameter_server"
    assert metrics["steps"] == epochs * STEPS_PER_EPOCH  # every step ran, on the workers left
    assert metrics["test_accuracy"] >= 0.8, metrics  # the single-host async test's bar


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_multi_worker_mirrored_one_worker_per_host_equals_numpy(bed, tmp_path):
    a, b = bed.hosts
    cluster = {"worker": [f"{a.address}:2222", f"{b.address}:2222"]}
    command = [PYTHON, os.path.join(WORKERS, "sync_steps.py"), str(tmp_path)]
    tasks = [Task(host, f"worker:{i}", command, TF_CONFIG=tf_config(cluster, "worker", i))
             for i, host in enumerate((a, b))]
    run_all(tasks, timeout=200)
    workers = load_workers(tmp_path, 2)
    assert all(str(w["backend"]) == "multi_worker" and int(w["replicas"]) == 2 for w in workers)
    check_mean_gradient_training(workers, steps=3, optimizer="sgd", tolerance=1e-5)


def horovodrun_over_ssh(bed, mesh, command, timeout, **env):
    """``horovodrun -np 4 -H hostA:2,hostB:2 --gloo`` started on host A, over SSH to host B."""
    a, b = bed.hosts
    argv = [*localrun.horovodrun(PYTHON), "-np", "4", "-H", f"{a.name}:2,{b.name}:2", "--gloo",
            "--network-interface", netns.IFACE, *mesh.horovodrun_args(), *command]
    result = a.run(argv, timeout=timeout, env=mesh.env(clean_env(**env)), cwd=REPO)
    if result.returncode != 0:
        pytest.fail(f"horovodrun exited {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_horovod_sync_over_ssh_two_hosts_equals_numpy(bed, mesh, tmp_path):
    # Each rank first records what listens on its host (horovodrun's rendezvous is up by then).
    listening = ["sh", "-c", 'ss -Hltn > "$0.$HOROVOD_RANK"; exec "$@"', str(tmp_path / "listening")]
    horovodrun_over_ssh(bed, mesh, [*listening, PYTHON, os.path.join(WORKERS, "sync_steps.py"), str(tmp_path),
                                    "--optimizer=adam"], timeout=240)
    a, b = bed.hosts
    on_a, on_b = ({line.split()[3] for line in (tmp_path / f"listening.{rank}").read_text().splitlines()}
                  for rank in (0, 2))
    # sshd (and Gloo, if a rank got there first) listen on each host's own address only;
    # horovodrun's rendezvous server on every interface of the host it runs on (Horovod has no
    # option to narrow it).
    assert f"{b.address}:22" in on_b and all(l.startswith(f"{b.address}:") for l in on_b), on_b
    assert f"{a.address}:22" in on_a and any(l.startswith(("0.0.0.0:", "*:")) for l in on_a), on_a
    workers = load_workers(tmp_path, 4)
    assert all(str(w["backend"]) == "horovod" and int(w["replicas"]) == 4 for w in workers)
    assert np.abs(workers[0]["kernel0"] - workers[2]["kernel0"]).max() > 1e-3  # the broadcast crossed hosts
    check_mean_gradient_training(workers, steps=3, optimizer="adam", tolerance=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hybrid_over_ssh_one_group_per_host_equals_numpy(bed, mesh, tmp_path):
    steps = 4
    horovodrun_over_ssh(bed, mesh, [PYTHON, os.path.join(WORKERS, "hybrid_steps.py"), str(tmp_path),
                                    json.dumps(SCENARIOS), f"--steps={steps}"], timeout=240)
    for name, knobs in SCENARIOS.items():
        workers = [np.load(tmp_path / f"{name}.rank{r}.npz") for r in range(4)]
        # No group_size given: one group per host (ranks 0, 1 on host A; 2, 3 on host B), dense
        # inside a host, compressed across, the same numbers as 2 groups of 2 on one host.
        assert [list(g) for g in workers[0]["groups"]] == [[0, 1], [2, 3]], name
        check_against_numpy(workers, knobs, steps, tolerance=1e-6)
