"""deploy/kubernetes/ and the Dockerfile: every manifest parses and has what tfsyncmodes relies on.

For the TFJob, the TF_CONFIG the operator will generate (one address per replica, role = the
replica type in lower case) goes through tfsyncmodes' own TF_CONFIG parser and async mode's
role check; for the plain Job, the container's own script builds it, run here by ``sh``.
"""
import glob
import json
import os
import shlex

import pytest
import yaml

from tests.conftest import PYTHON, REPO, clean_env
from tfsyncmodes.cluster import tf_config as parse_tf_config
from tfsync_testbed import localrun
from tfsyncmodes.tf_configs import plan

DEPLOY = os.path.join(REPO, "deploy", "kubernetes")
IMAGE = "tfsyncmodes:0.1.0"
TF_PORT = 2222


def documents():
    found = {}
    for path in sorted(glob.glob(os.path.join(DEPLOY, "*.yaml"))):
        with open(path, encoding="utf-8") as handle:
            for doc in yaml.safe_load_all(handle):
                if doc:
                    found[(os.path.basename(path), doc["kind"])] = doc
    return found


def containers(pod_template):
    return pod_template["spec"]["containers"]


def train_flags(command):
    """The flags of a scripts/train.py command; its tfsyncmodes knobs must be in force (a knob
    given that the run ignores, like topk_ratio without compression=topk, is a mistake)."""
    from tfsyncmodes import config, flags as flag_defs

    assert command[:2] == ["python", "scripts/train.py"], command
    given = flag_defs.parse_known(command[1:])
    knobs = {k.key: given[k.flag].value for k in config.KNOBS if given[k.flag].present}
    ignored = set(knobs) - set(config.resolve(knobs, environ={}, use_flags=False).knobs_in_force())
    assert not ignored, (command, ignored)
    return dict(arg[2:].split("=", 1) for arg in command[2:] if arg.startswith("--") and "=" in arg)


def test_every_manifest_parses_and_runs_the_image_the_dockerfile_builds():
    docs = documents()
    assert {kind for _, kind in docs} == {"TFJob", "MPIJob", "Job", "Service"}
    images = set()
    for (_, kind), doc in docs.items():
        specs = (doc["spec"].get("tfReplicaSpecs") or doc["spec"].get("mpiReplicaSpecs")
                 or ({"pod": doc["spec"]} if kind == "Job" else {}))
        for spec in specs.values():
            images.update(c["image"] for c in containers(spec["template"]))
    assert images == {IMAGE}
    with open(os.path.join(REPO, "Dockerfile"), encoding="utf-8") as handle:
        dockerfile = handle.read()
    assert f"docker build -t {IMAGE} ." in dockerfile
    assert "RUN bash scripts/install.sh" in dockerfile and "openssh-server" in dockerfile
    assert "ENV PATH=/opt/venv/bin:$PATH" in dockerfile and "TFSYNC_VENV=/opt/venv" in dockerfile


def test_tfjob_replicas_make_an_async_cluster_tfsyncmodes_accepts():
    job = documents()[("tfjob-async.yaml", "TFJob")]
    assert job["apiVersion"] == "kubeflow.org/v1"
    replicas = job["spec"]["tfReplicaSpecs"]
    assert set(replicas) == {"Chief", "PS", "Worker"} and replicas["Chief"]["replicas"] == 1
    name = job["metadata"]["name"]
    # What the operator generates: role = replica type in lower case, one address per replica.
    cluster = {kind.lower(): [f"{name}-{kind.lower()}-{i}.default.svc:{TF_PORT}" for i in range(spec["replicas"])]
               for kind, spec in replicas.items()}
    for kind, spec in replicas.items():
        (container,) = containers(spec["template"])
        assert container["name"] == "tensorflow"  # the operator's default container name
        assert {"name": "tfjob-port", "containerPort": TF_PORT} in container["ports"]
        assert {"name": "GRPC_FAIL_FAST", "value": "use_caller"} in container["env"]
        assert train_flags(container["command"])["sync_mode"] == "async"
        for index in range(spec["replicas"]):
            text = json.dumps({"cluster": cluster, "task": {"type": kind.lower(), "index": index}})
            parsed = parse_tf_config({"TF_CONFIG": text})
            parsed.require_roles("async", allowed=("chief", "worker", "ps"), required=("chief", "worker", "ps"))
            assert parsed.is_chief == (kind == "Chief")
    chief_flags = train_flags(containers(replicas["Chief"]["template"])[0]["command"])
    assert chief_flags["model_dir"].startswith("/runs")
    mounts = containers(replicas["Chief"]["template"])[0]["volumeMounts"]
    assert {"name": "runs", "mountPath": "/runs"} in mounts


@pytest.mark.parametrize("mode", ["sync", "hybrid"])
def test_mpijob_launcher_runs_horovodrun_over_gloo_with_the_operators_hostfile(mode):
    job = documents()[(f"mpijob-{mode}.yaml", "MPIJob")]
    assert job["apiVersion"] == "kubeflow.org/v2beta1"
    spec = job["spec"]
    launcher, workers = spec["mpiReplicaSpecs"]["Launcher"], spec["mpiReplicaSpecs"]["Worker"]
    assert launcher["replicas"] == 1
    command = containers(launcher["template"])[0]["command"]
    assert command[0] == "horovodrun" and "--gloo" in command
    option = {command[i]: command[i + 1] for i in range(1, command.index("python") - 1)
              if command[i].startswith("-") and not command[i + 1].startswith("-")}
    assert option["--hostfile"] == "/etc/mpi/hostfile"
    # -np is every slot of every worker pod.
    assert int(option["-np"]) == spec["slotsPerWorker"] * workers["replicas"]
    assert option["--network-interface"] == "eth0"
    flags = train_flags(command[command.index("python"):])
    assert flags["sync_mode"] == mode
    assert "sync_group_size" not in flags  # hybrid: one group per worker pod (its slotsPerWorker ranks)
    assert containers(workers["template"])[0]["command"] == ["/usr/sbin/sshd", "-De"]
    assert spec["sshAuthMountPath"] == "/root/.ssh"


@pytest.mark.timeout(60)
def test_plain_job_builds_each_workers_tf_config_from_the_pod_hostnames(tmp_path):
    docs = documents()
    job, service = docs[("job-multiworker.yaml", "Job")], docs[("job-multiworker.yaml", "Service")]
    assert service["spec"]["clusterIP"] == "None"  # headless: per-pod DNS names
    pod = job["spec"]["template"]
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert job["spec"]["completionMode"] == "Indexed"
    count = job["spec"]["completions"]
    assert job["spec"]["parallelism"] == count
    (container,) = containers(pod)
    env = {e["name"]: e["value"] for e in container["env"]}
    assert int(env["WORKERS"]) == count and env["JOB_NAME"] == job["metadata"]["name"]
    assert env["SERVICE"] == service["metadata"]["name"]
    assert container["command"][:2] == ["sh", "-c"]
    script = container["command"][2]
    # Run the container's script for every index; a `python` first on PATH reports what
    # the real one would have been started with.
    shim = tmp_path / "python"
    shim.write_text('#!/bin/sh\nprintf "%s\\n" "$TF_CONFIG"\nprintf "%s\\n" "$*"\n')
    shim.chmod(0o755)
    expected = [f"{job['metadata']['name']}-{i}.{service['metadata']['name']}:{TF_PORT}" for i in range(count)]
    for index in range(count):
        result = localrun.run(["sh", "-c", script], timeout=30, env=dict(
            env, PATH=f"{tmp_path}:/usr/bin:/bin", JOB_COMPLETION_INDEX=str(index)))
        assert result.returncode == 0, result.stderr
        text, args = result.stdout.splitlines()
        parsed = parse_tf_config({"TF_CONFIG": text})
        assert parsed.cluster == {"worker": tuple(expected)}
        assert (parsed.task_type, parsed.task_index) == ("worker", index)
        assert train_flags(["python", *shlex.split(args)])["sync_mode"] == "sync"


# --- python -m tfsyncmodes.launch --print-tf-config ---------------------------------------

@pytest.mark.timeout(120)
def test_print_tf_config_gives_every_task_its_tf_config():
    result = localrun.run([PYTHON, "-m", "tfsyncmodes.launch", "--print-tf-config", "--hosts", "a,b",
                           "--workers", "2", "--ps", "1"], timeout=100, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr
    lines = [l for l in result.stdout.splitlines() if l.startswith("TF_CONFIG=")]
    comments = [l for l in result.stdout.splitlines() if l.startswith("# ") and " on " in l]
    configs = [parse_tf_config({"TF_CONFIG": shlex.split(l)[0].split("=", 1)[1]}) for l in lines]
    tasks = sorted((c.task_type, c.task_index) for c in configs)
    assert tasks == [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    cluster = configs[0].cluster
    assert all(c.cluster == cluster for c in configs)
    assert cluster["chief"] == ("a:2222",)
    addresses = [a for role in cluster.values() for a in role]
    assert len(set(addresses)) == 4 and {a.split(":")[0] for a in addresses} == {"a", "b"}
    for config in configs:
        config.require_roles("async", allowed=("chief", "worker", "ps"), required=("chief", "worker", "ps"))
    for comment, config in zip(comments, configs):  # "# worker:1 on b" names the task and its host
        role_index, host = comment[2:].split(" on ")
        assert role_index == f"{config.task_type}:{config.task_index}"
        assert cluster[config.task_type][config.task_index].split(":")[0] == host


def test_tf_config_plan_without_ps_is_a_multi_worker_cluster():
    cluster, tasks = plan(["h1", "h2", "h3"], workers=3, ps=0, port=4000)
    assert cluster == {"worker": ["h1:4000", "h2:4000", "h3:4000"]}
    assert [t[:2] for t in tasks] == [("worker", 0), ("worker", 1), ("worker", 2)]
    cluster, _ = plan(["h1"], workers=2, ps=2, port=4000)  # one host: consecutive ports
    assert sorted(a for role in cluster.values() for a in role) == [f"h1:{p}" for p in range(4000, 4005)]


@pytest.mark.parametrize("args, words", [
    (["--hosts", ""], ["--hosts", "names no host"]),
    (["--hosts", "a,,b"], ["--hosts", "empty one"]),
    (["--hosts", "a:2222,b"], ["--hosts", "'a:2222'", "without ports"]),
    (["--hosts", "a,a"], ["--hosts", "twice"]),
])
@pytest.mark.timeout(60)
def test_print_tf_config_bad_hosts_is_one_clear_line(args, words):
    result = localrun.run([PYTHON, os.path.join(REPO, "tfsyncmodes", "launch.py"), "--print-tf-config", *args],
                          timeout=50, env=clean_env(), cwd=REPO)
    assert result.returncode == 2
    errors = [l for l in result.stderr.splitlines() if "error:" in l]
    assert len(errors) == 1 and all(w in errors[0] for w in words), result.stderr
    assert "Traceback" not in result.stderr

