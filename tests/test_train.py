"""scripts/train.py end to end: one process, horovodrun -np 4, and a 2-worker TF_CONFIG cluster."""
import json
import os

import pytest

from tests import events
from tests.conftest import PYTHON, REPO, REUSE_PORT_ENV, run_checked, run_cluster, tf_config
from tfsync_testbed import localrun

TRAIN = os.path.join(REPO, "scripts", "train.py")
# Whole training runs: 30-90 s each on 2 cores.
pytestmark = pytest.mark.slow
MIN_ACCURACY = 0.9  # digits, 5 epochs: about 0.96 in every backend


def train_args(tmp_path, epochs=5):
    return [TRAIN, f"--epochs={epochs}", f"--model_dir={tmp_path / 'run'}",
            f"--metrics_file={tmp_path / 'metrics.json'}"]


def check_run(tmp_path, backend, replicas):
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["backend"] == backend and metrics["replicas"] == replicas
    assert metrics["test_accuracy"] >= MIN_ACCURACY, metrics
    assert metrics["steps"] == metrics["epochs"] * (1437 // 64)
    run_dir = tmp_path / "run" / "sync"
    assert (run_dir / "model.keras").is_file() and (run_dir / "checkpoint.weights.h5").is_file()
    # TensorBoard has every epoch's loss, the last one the History's (float32 on disk).
    written = events.scalars(run_dir / "logs" / "train")
    assert len(written["epoch_loss"]) == metrics["epochs"]
    assert written["epoch_loss"][-1] == pytest.approx(metrics["final_loss"], rel=1e-6)
    assert len(written["epoch_accuracy"]) == metrics["epochs"]
    return metrics


@pytest.mark.timeout(180)
def test_train_one_process(tmp_path):
    result = run_checked([PYTHON, *train_args(tmp_path)], timeout=150)
    check_run(tmp_path, "mirrored", 1)
    assert "test accuracy:" in result.stdout


@pytest.mark.timeout(300)
def test_train_horovodrun_four_ranks_chief_only_output(tmp_path):
    result = run_checked(localrun.horovodrun_command(4, [PYTHON, *train_args(tmp_path)]), timeout=260)
    check_run(tmp_path, "horovod", 4)
    assert "[0]<stdout>:Epoch 1/5" in result.stdout
    for rank in (1, 2, 3):
        assert f"[{rank}]<stdout>:Epoch" not in result.stdout
        assert f"[{rank}]<stdout>:test accuracy" not in result.stdout


@pytest.mark.timeout(300)
def test_train_multi_worker_from_tf_config(tmp_path, owned_ports):
    cluster = {"worker": [f"127.0.0.1:{p}" for p in owned_ports(2)]}
    command = [PYTHON, *train_args(tmp_path)]
    results = run_cluster([command, command], timeout=260,
                          env_per_task=[{"TF_CONFIG": tf_config(cluster, "worker", i), **REUSE_PORT_ENV}
                                         for i in range(2)])
    check_run(tmp_path, "multi_worker", 2)
    assert "test accuracy:" in results[0].stdout and "test accuracy:" not in results[1].stdout
    # The fit-like loop shows the chief's progress bar, and only the chief's.
    assert "Epoch 1/5" in results[0].stdout and "Epoch 1/5" not in results[1].stdout


def test_samples_count_every_groups_steps_and_a_switching_runs_sync_epochs():
    """The trainer's `samples`: a sync epoch (no hybrid rounds) is steps_per_epoch global batches;
    a hybrid epoch with speed-proportional steps is each group's steps x its share of the batch."""
    from tfsyncmodes.examples.run_metrics import trained_samples

    batch, per_epoch = 64, 22
    logs = {"loss": [2.0, 1.0, 0.5, 0.4],  # sync, hybrid (2 rounds), hybrid (3 rounds), sync
            "local_steps_rounds": [0.0, 2.0, 3.0, 0.0],
            "local_steps_group0": [0.0, 8.0, 7.0, 0.0], "local_steps_group1": [0.0, 2.0, 1.0, 0.0]}
    expected = per_epoch * batch + (2 * 8 + 2 * 2) * 32 + (3 * 7 + 3 * 1) * 32 + per_epoch * batch
    assert trained_samples(logs, steps=88, steps_per_epoch=per_epoch, batch_size=batch) == expected
    # no rounds at all (a run that never left sync): the steps it ran
    never = {**logs, "local_steps_rounds": [0.0] * 4}
    assert trained_samples(never, steps=88, steps_per_epoch=per_epoch, batch_size=batch) == 88 * batch
