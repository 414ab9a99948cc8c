"""Async mode on real gRPC parameter-server clusters on 127.0.0.1, started by the launcher."""
import io
import json
import os
import re
import signal
import subprocess
import threading
import time
import zipfile

import h5py
import numpy as np
import pytest

from tests import events, reference
from tests.conftest import PYTHON, REPO, WORKERS, clean_env
from tfsync_testbed import localrun

TRAIN = os.path.join(REPO, "scripts", "train.py")
# Real clusters of 4 processes on 2 cores: about 40-120 s each.
pytestmark = pytest.mark.slow
STEPS_PER_EPOCH = 1437 // 64
# A killed ps stops the chief within this many seconds.
STOP_SECONDS = 10


class Cluster:
    """``python -m tfsyncmodes.launch ...`` with its output collected line by line."""

    def __init__(self, launch_args, command, **env):
        self.lines = []
        self.times = []  # when each line arrived (time.monotonic)
        self.process = subprocess.Popen(
            [PYTHON, "-m", "tfsyncmodes.launch", *launch_args, "--", *command], cwd=REPO,
            env=clean_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace", start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.times.append(time.monotonic())
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
            time.sleep(0.02)
        self.stop()
        pytest.fail(f"no line matching {pattern!r} within {timeout}s:\n{self.output[-6000:]}")

    def first_time(self, pattern):
        """When the first line matching `pattern` arrived, or None."""
        for when, line in zip(list(self.times), list(self.lines)):
            if re.search(pattern, line):
                return when
        return None

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


def train_command(tmp_path, epochs, model_dir=None, batch_size=64, python=PYTHON):
    return [python, TRAIN, "--sync_mode=async", f"--epochs={epochs}", f"--batch_size={batch_size}",
            f"--model_dir={model_dir or tmp_path / 'run'}", f"--metrics_file={tmp_path / 'metrics.json'}"]


def h5_arrays(source):
    """Every dataset of a Keras weights file (a path, or a file object), by its path in the file."""
    found = {}
    with h5py.File(source, "r") as handle:
        handle.visititems(lambda name, item: found.__setitem__(name, np.array(item))
                          if isinstance(item, h5py.Dataset) else None)
    return found


def epochs_started(lines):
    """The epoch numbers the chief's progress bar announced, in order."""
    return [int(m.group(1)) for m in (re.match(r"\[chief:0\] Epoch (\d+)/", l) for l in lines) if m]


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
    # The chief logs the resolved configuration with the source of every value.
    assert re.search(r"\[chief:0\] .*\bmode\s+= 'async'\s+\(flag\)", cluster.output), cluster.output[:4000]
    assert re.search(r"\[chief:0\] .*\bstaleness_aware_lr\s+= True\s+\(default\)", cluster.output)
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
    run_dir = tmp_path / "run" / "async"
    assert (run_dir / "model.keras").is_file() and (run_dir / "checkpoint.weights.h5").is_file()
    if not legacy:
        # The last epoch's checkpoint (the chief copies the backup's file) holds the weights and
        # optimizer state the trained model was saved with, read from the model's own file.
        with zipfile.ZipFile(run_dir / "model.keras") as saved:
            final = h5_arrays(io.BytesIO(saved.read("model.weights.h5")))
        checkpoint = h5_arrays(run_dir / "checkpoint.weights.h5")
        assert sorted(checkpoint) == sorted(final) and any(k.startswith("layers/") for k in final), \
            (sorted(checkpoint), sorted(final))
        for name, value in final.items():
            assert np.array_equal(checkpoint[name], value), name
    # TensorBoard has each epoch's loss and staleness, as the History has them.
    written = events.scalars(tmp_path / "run" / "async" / "logs" / "train")
    assert len(written["epoch_loss"]) == epochs
    assert written["epoch_loss"][-1] == pytest.approx(metrics["final_loss"], rel=1e-6)
    key = "staleness" if legacy else "staleness_mean"
    assert written[f"epoch_{key}"] == pytest.approx(metrics[key], rel=1e-6)
    assert 0 <= written["epoch_accuracy"][-1] <= 1


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
@pytest.mark.timeout(180)
def test_forced_stale_update_gets_the_scaled_learning_rate(tmp_path, legacy):
    cluster = Cluster(["--workers", "1", "--ps", "1", "--timeout", "150"],
                      [PYTHON, os.path.join(WORKERS, "async_stale.py"), str(tmp_path)],
                      TF_USE_LEGACY_KERAS="1" if legacy else "0")
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


@pytest.mark.slow
@pytest.mark.solo  # it judges time: the chief's own error within seconds of the loss
@pytest.mark.timeout(400)
def test_losing_a_ps_stops_with_a_clear_error_and_a_rerun_resumes(tmp_path):
    epochs = 6  # the kill at epoch 4; the rerun trains what is left
    model_dir = tmp_path / "run"
    # Batches of 16: 89 steps an epoch, so the kill lands well inside an epoch.
    command = train_command(tmp_path, epochs, model_dir, batch_size=16)
    cluster = Cluster(["--workers", "2", "--ps", "1", "--timeout", "200"], command)
    cluster.wait_for(r"\[chief:0\] Epoch 4/", timeout=150)
    killed = time.monotonic()
    os.kill(cluster.pid("ps:0"), signal.SIGKILL)
    status = cluster.finish(120)
    assert status != 0
    # The launcher says so; when the chief's own error ends it first, the launcher reports the
    # ps's exit beside the chief's instead of stopping the cluster for it.
    lost = r"\[launch\] ps:0 exited with status -9(; stopping the cluster)?$"
    said = [l for l in cluster.lines if re.search(lost, l)]
    assert len(said) == 1, cluster.output[-5000:]
    chief_errors = [l for l in cluster.lines if l.startswith("[chief:0] tfsyncmodes: error:")]
    assert len(chief_errors) == 1 and "ps:0 at 127.0.0.1:" in chief_errors[0], cluster.output[-5000:]
    # The chief stops by itself within seconds (the launcher would SIGTERM it after 5 s).
    stopped = cluster.first_time(r"^\[chief:0\] tfsyncmodes: error:") - killed
    assert stopped < STOP_SECONDS, stopped
    assert not any("Traceback" in l for l in cluster.lines if l.startswith("[chief:0]"))
    assert (model_dir / "async" / "backup").is_dir()
    # The epoch the kill interrupted; every earlier one finished (and was backed up).
    interrupted = epochs_started(cluster.lines)[-1]
    assert interrupted >= 4

    rerun = Cluster(["--workers", "2", "--ps", "1", "--timeout", "250"], command)
    assert rerun.finish(280) == 0, rerun.output[-6000:]
    # It resumes right after the last finished epoch: neither earlier nor later.
    assert epochs_started(rerun.lines)[0] == interrupted, (interrupted, rerun.output[:3000])
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == epochs * (1437 // 16)


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
@pytest.mark.timeout(240)
def test_variables_are_placed_on_both_ps(tmp_path, legacy):
    env = {"TF_USE_LEGACY_KERAS": "1", "TFSYNC_PS_SHARDS": "2", "TFSYNC_MIN_SHARD_BYTES": "4096"} if legacy else {}
    cluster = Cluster(["--workers", "1", "--ps", "2", "--timeout", "200"],
                      [PYTHON, os.path.join(WORKERS, "async_placement.py"), str(tmp_path)], **env)
    assert cluster.finish(220) == 0, cluster.output[-6000:]
    placement = json.loads((tmp_path / "placement.json").read_text())
    assert placement["iterations"] == placement["expected_steps"] and all(placement["changed"])
    # --sync_exactly_once (the default) cannot make a step's writes one unit over two ps: a line says so.
    assert "not one unit (several ps tasks)" in cluster.output, cluster.output[-3000:]
    variables = {}  # name -> [(shape, ps task)] of its parts; tf_keras lists shards as part_<i>
    for variable in placement["variables"]:
        name = re.sub(r"(/part_\d+)?(:\d+)?$", "", variable["name"])
        for part in variable["parts"]:
            task = re.match(r"/job:ps/replica:0/task:(\d+)/", part["device"])
            assert task, part  # every variable lives on a parameter server
            variables.setdefault(name, []).append((part["shape"], int(task.group(1))))
    kernels = {n: p for n, p in variables.items() if n.endswith("kernel")}
    biases = {n: p for n, p in variables.items() if n.endswith("bias")}
    assert len(kernels) == len(biases) == 2, variables
    if legacy:
        # --sync_ps_shards=2: each kernel (> 2 x 4096 bytes) is split along its first axis, one
        # shard on each ps; the biases are below the minimum shard size and stay whole.
        for name, parts in kernels.items():
            assert sorted(task for _, task in parts) == [0, 1], (name, parts)
            assert len({tuple(shape[1:]) for shape, _ in parts}) == 1
        # The whole kernels, (64, 128) and (128, 10), by their shapes: a variable's name depends
        # on how many layers the process made before.
        assert sorted(sum(shape[0] for shape, _ in parts) for parts in kernels.values()) == [64, 128], kernels
        assert all(len(parts) == 1 for parts in biases.values())
    else:
        # Keras 3: whole variables, spread over the ps tasks round-robin.
        assert all(len(parts) == 1 for parts in variables.values())
        assert {parts[0][1] for parts in variables.values()} == {0, 1}
