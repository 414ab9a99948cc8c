"""Async mode on real gRPC parameter-server clusters on 127.0.0.1, started by the launcher."""
import json
import os
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from tests import reference
from tests.conftest import PYTHON, REPO, WORKERS, clean_env
from tfsyncmodes.testing import localrun

TRAIN = os.path.join(REPO, "scripts", "train.py")
STEPS_PER_EPOCH = 1437 // 64


class Cluster:
    """``python -m tfsyncmodes.launch ...`` with its output collected line by line."""

    def __init__(self, launch_args, command, **env):
        self.lines = []
        self.process = subprocess.Popen(
            [PYTHON, "-m", "tfsyncmodes.launch", *launch_args, "--", *command], cwd=REPO,
            env=clean_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace", start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self):
        return "\n".join(self.lines)

    def wait_for(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(re.search(pattern, line) for line in self.lines):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"no line matching {pattern!r} within {timeout}s:\n{self.output[-6000:]}")

    def pid(self, task):
        for line in self.lines:
            match = re.match(rf"\[launch\] started {re.escape(task)} pid (\d+)", line)
            if match:
                return int(match.group(1))
        raise AssertionError(f"{task} was not started:\n{self.output[-3000:]}")

    def finish(self, timeout):
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"cluster did not finish within {timeout}s:\n{self.output[-6000:]}")
        self._reader.join(timeout=5)
        return self.process.returncode

    def stop(self):
        localrun.kill_group(self.process, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            localrun.kill_group(self.process)
            self.process.wait()


def train_command(tmp_path, epochs, model_dir=None):
    return [PYTHON, TRAIN, "--sync_mode=async", f"--epochs={epochs}",
            f"--model_dir={model_dir or tmp_path / 'run'}", f"--metrics_file={tmp_path / 'metrics.json'}"]


def exit_statuses(output):
    line = [l for l in output.splitlines() if l.startswith("[launch] exit statuses:")][-1]
    return dict(item.split("=") for item in line.split(":", 1)[1].split())


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
@pytest.mark.timeout(240)
def test_async_training_counts_every_step_and_measures_staleness(tmp_path, legacy):
    epochs = 5
    cluster = Cluster(["--workers", "2", "--ps", "1", "--timeout", "200"], train_command(tmp_path, epochs),
                      TF_USE_LEGACY_KERAS="1" if legacy else "0")
    assert cluster.finish(220) == 0, cluster.output[-6000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["backend"] == "parameter_server"
    # Keras 3 alone loses concurrent increments of optimizer.iterations; here none may be lost.
    assert metrics["steps"] == epochs * STEPS_PER_EPOCH
    assert metrics["test_accuracy"] >= 0.8, metrics
    if legacy:
        assert len(metrics["staleness"]) == epochs
    else:
        assert len(metrics["staleness_mean"]) == epochs
        assert all(0 <= m <= x for m, x in zip(metrics["staleness_mean"], metrics["staleness_max"]))
        # Two workers updating concurrently: some update must have been stale.
        assert max(metrics["staleness_max"]) >= 1
    # Workers and ps leave by themselves, with status 0, once the chief is done.
    assert set(exit_statuses(cluster.output).values()) == {"0"}, cluster.output[-3000:]
    assert (tmp_path / "run" / "async" / "model.keras").is_file()


@pytest.mark.timeout(180)
def test_forced_stale_update_gets_the_scaled_learning_rate(tmp_path):
    cluster = Cluster(["--workers", "1", "--ps", "1", "--timeout", "150"],
                      [PYTHON, os.path.join(WORKERS, "async_stale.py"), str(tmp_path)])
    assert cluster.finish(170) == 0, cluster.output[-6000:]
    saved = np.load(tmp_path / "stale.npz")
    assert list(saved["staleness"]) == [0, 3]
    assert int(saved["iterations"]) == 1 + 3 + 1
    k_size = int(np.prod(saved["kernel_shape"]))
    x, y = saved["x"], saved["y"]

    def sgd(w, scale):
        kernel, bias = w[:k_size].reshape(saved["kernel_shape"]), w[k_size:]
        g_kernel, g_bias = reference.mse_gradients(kernel, bias, x, y)
        return w - reference.LR * scale * np.concatenate([g_kernel.ravel(), g_bias])

    w0, w1, w2 = saved["w"]
    np.testing.assert_allclose(w1, sgd(w0, 1.0), atol=1e-6)
    np.testing.assert_allclose(w2, sgd(w1, 1.0 / (1 + 3)), atol=1e-6)
    assert np.abs(w2 - sgd(w1, 1.0)).max() > 1e-3  # an unscaled step would differ


@pytest.mark.timeout(300)
def test_losing_a_worker_keeps_the_run_going_with_an_exact_step_count(tmp_path):
    epochs = 12
    cluster = Cluster(["--workers", "2", "--ps", "1", "--timeout", "260", "--tolerate_worker_loss"],
                      train_command(tmp_path, epochs))
    cluster.wait_for(r"\[chief:0\] Epoch 3/", timeout=150)
    os.kill(cluster.pid("worker:1"), signal.SIGKILL)
    assert cluster.finish(250) == 0, cluster.output[-6000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == epochs * STEPS_PER_EPOCH
    assert "worker:1 at 127.0.0.1:" in cluster.output and "was lost" in cluster.output
    assert exit_statuses(cluster.output)["worker:1"] == "-9"


@pytest.mark.timeout(400)
def test_losing_a_ps_stops_with_a_clear_error_and_a_rerun_resumes(tmp_path):
    epochs = 40
    model_dir = tmp_path / "run"
    cluster = Cluster(["--workers", "2", "--ps", "1", "--timeout", "200"], train_command(tmp_path, epochs, model_dir))
    cluster.wait_for(r"\[chief:0\] Epoch 4/", timeout=150)
    killed = time.monotonic()
    os.kill(cluster.pid("ps:0"), signal.SIGKILL)
    status = cluster.finish(120)
    assert time.monotonic() - killed < 60
    assert status != 0
    assert "[launch] ps:0 exited with status -9; stopping the cluster" in cluster.output
    chief_errors = [l for l in cluster.lines if l.startswith("[chief:0] tfsyncmodes: error:")]
    assert len(chief_errors) == 1 and "ps:0 at 127.0.0.1:" in chief_errors[0], cluster.output[-5000:]
    assert not any("Traceback" in l for l in cluster.lines if l.startswith("[chief:0]"))
    assert (model_dir / "async" / "backup").is_dir()

    rerun = Cluster(["--workers", "2", "--ps", "1", "--timeout", "250"], train_command(tmp_path, epochs, model_dir))
    assert rerun.finish(280) == 0, rerun.output[-6000:]
    first_epoch = int(re.search(r"\[chief:0\] Epoch (\d+)/", rerun.output).group(1))
    assert first_epoch >= 3, "the rerun did not resume from the backup"
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == epochs * STEPS_PER_EPOCH


@pytest.mark.timeout(240)
def test_tf_keras_shards_variables_over_two_ps(tmp_path):
    command = train_command(tmp_path, 2) + ["--ps_shards=2", "--min_shard_bytes=4096"]
    cluster = Cluster(["--workers", "1", "--ps", "2", "--timeout", "200"], command, TF_USE_LEGACY_KERAS="1")
    assert cluster.finish(220) == 0, cluster.output[-6000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == 2 * STEPS_PER_EPOCH
    assert "ps_shards          = 2            (flag)" in cluster.output
