"""Sync mode over tf.distribute: MirroredStrategy on 2 logical CPUs and
MultiWorkerMirroredStrategy with 2 local worker processes from TF_CONFIG."""
import os

import pytest

from tests.conftest import PYTHON, REUSE_PORT_ENV, WORKERS, run_checked, run_cluster, tf_config
from tests.test_sync_horovod import check_mean_gradient_training, load_workers


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
@pytest.mark.timeout(180)
def test_mirrored_two_logical_cpus_equals_numpy(tmp_path, legacy):
    env = {"TF_USE_LEGACY_KERAS": "1"} if legacy else {}
    run_checked([PYTHON, os.path.join(WORKERS, "sync_steps.py"), str(tmp_path), "--logical_cpus=2"],
                timeout=150, **env)
    (worker,) = load_workers(tmp_path, 1)
    assert str(worker["backend"]) == "mirrored" and int(worker["replicas"]) == 2
    # SGD is scale-sensitive: a second reduction on top of the strategy's would show here.
    check_mean_gradient_training([worker], steps=3, optimizer="sgd", tolerance=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
@pytest.mark.timeout(240)
def test_multi_worker_two_processes_equals_numpy(tmp_path, legacy, owned_ports):
    cluster = {"worker": [f"127.0.0.1:{p}" for p in owned_ports(2)]}
    command = [PYTHON, os.path.join(WORKERS, "sync_steps.py"), str(tmp_path)]
    envs = [dict(TF_CONFIG=tf_config(cluster, "worker", i), **REUSE_PORT_ENV,
                 **({"TF_USE_LEGACY_KERAS": "1"} if legacy else {}))
            for i in range(2)]
    run_cluster([command, command], timeout=200, env_per_task=envs)
    workers = load_workers(tmp_path, 2)
    assert all(str(w["backend"]) == "multi_worker" and int(w["replicas"]) == 2 for w in workers)
    check_mean_gradient_training(workers, steps=3, optimizer="sgd", tolerance=1e-5)
