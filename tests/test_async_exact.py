"""Async mode counts exactly under concurrent workers: the parameter-server copy of
``optimizer.iterations``, every compiled metric's state and the epoch logs read from it;
``EarlyStopping`` through the fit-like loop; ``--sync_slow_worker`` slows its worker."""
import os
import re

import numpy as np
import pytest

from tests.conftest import PYTHON, WORKERS
from tests.test_async import Cluster

CHECKS = os.path.join(WORKERS, "async_checks.py")
pytestmark = pytest.mark.slow  # a real 4-process cluster each


def run_checks(tmp_path, scenarios, workers=2, **env):
    cluster = Cluster(["--workers", str(workers), "--ps", "1", "--timeout", "200"],
                      [PYTHON, CHECKS, str(tmp_path), *scenarios], **env)
    assert cluster.finish(220) == 0, cluster.output[-6000:]
    return cluster


def numpy_classifier(saved):
    """Accuracy and mean cross-entropy of the saved linear classifier on the saved examples."""
    logits = saved["x"].astype(np.float64) @ saved["kernel"] + saved["bias"]
    accuracy = np.mean(np.argmax(logits, axis=1) == saved["y"])
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return accuracy, -np.mean(log_probs[np.arange(len(saved["y"])), saved["y"]])


def check_exact_metrics(saved):
    state = dict(zip(saved["variable_paths"], saved["variable_values"]))
    examples = int(saved["steps"]) * int(saved["batch"])
    # Every example of every step is counted once: no increment lost to a concurrent worker.
    assert state["accuracy/count"] == examples, state
    assert state["loss/count"] == examples, state
    accuracy, loss = numpy_classifier(saved)
    assert 0.1 < accuracy < 0.9  # neither trivially 0 nor 1
    # The learning rate is 0, so every step saw the saved weights' predictions.
    assert state["accuracy/total"] == accuracy * examples
    assert float(saved["accuracy"]) == pytest.approx(accuracy, abs=1e-7)
    assert float(saved["loss"]) == pytest.approx(loss, rel=1e-5)
    assert int(saved["iterations"]) == int(saved["steps"])


@pytest.mark.timeout(260)
def test_keras3_counter_metrics_and_early_stopping_are_exact(tmp_path):
    cluster = run_checks(tmp_path, ["counter", "metrics", "early_stopping"])
    counter = np.load(tmp_path / "counter.npz")
    runs = np.bincount(counter["workers"], minlength=2)
    assert runs.min() > 0, runs  # both workers updated the counter, concurrently
    # The parameter-server copy of optimizer.iterations, with no loop to correct it afterwards.
    assert int(counter["iterations"]) == int(counter["scheduled"]) == runs.sum()
    check_exact_metrics(np.load(tmp_path / "metrics.npz"))
    stopped = np.load(tmp_path / "early_stopping.npz")
    # min_delta is never reached: epoch 1 sets the best loss, epoch 2 exhausts patience 1.
    assert int(stopped["epochs"]) == 2
    assert int(stopped["iterations"]) == 2 * int(stopped["steps_per_epoch"])
    # The loop never had to correct the optimizer's count.
    assert "optimizer.iterations counted" not in cluster.output


@pytest.mark.timeout(260)
def test_tf_keras_epoch_metrics_are_exact(tmp_path):
    cluster = run_checks(tmp_path, ["metrics"], TF_USE_LEGACY_KERAS="1")
    check_exact_metrics(np.load(tmp_path / "metrics.npz"))
    # tf_keras read the epoch's logs from the metric state, not from the last step fetched.
    assert "Could not get Model metric results" not in cluster.output


@pytest.mark.timeout(260)
def test_slow_worker_runs_a_smaller_share_of_the_steps(tmp_path):
    run_checks(tmp_path, ["counter"], TFSYNC_SLOW_WORKER="1:8")
    counter = np.load(tmp_path / "counter.npz")
    runs = np.bincount(counter["workers"], minlength=2)
    # Worker 1 runs 1/8 of the time; the coordinator gives the free worker the next step.
    assert 0 < runs[1] < runs[0] / 2, runs
    assert int(counter["iterations"]) == int(counter["scheduled"])


def finish_lost(tmp_path, scenario, legacy, exactly_once=True):
    """Runs the linear-loss fit whose worker of one step dies, to its end: (cluster, saved)."""
    # Without staleness-aware scaling every update is lr x the gradient, whichever worker made it.
    env = {"TFSYNC_STALENESS_AWARE_LR": "false", "TFSYNC_EXACTLY_ONCE": str(exactly_once).lower(),
           **({"TF_USE_LEGACY_KERAS": "1"} if legacy else {})}
    cluster = Cluster(["--workers", "2", "--ps", "1", "--timeout", "200", "--tolerate_worker_loss"],
                      [PYTHON, CHECKS, str(tmp_path), scenario], **env)
    assert cluster.finish(220) == 0, cluster.output[-6000:]
    # The unit of writes has no loop, where the worker's loss could cut it (once.loops_in).
    assert "unit of writes has a loop" not in cluster.output, cluster.output[-6000:]
    return cluster, np.load(tmp_path / f"{scenario}.npz")


def run_lost(tmp_path, scenario, legacy, exactly_once=True):
    """Runs the linear-loss fit whose worker of one step dies; checks the update count in NumPy."""
    cluster, saved = finish_lost(tmp_path, scenario, legacy, exactly_once)
    # The step's worker really died (SIGABRT), and the coordinator ran the step again.
    assert int(saved["fired"]) == 1 and bool(saved["exactly_once"]) == exactly_once
    assert re.search(r"\[launch\] worker:\d exited with status -6", cluster.output), cluster.output[-6000:]
    steps, lr = int(saved["steps"]), np.float32(saved["lr"])
    # --sync_exactly_once=false: the coordinator's at least once, the lost step applied twice.
    updates = steps if exactly_once else steps + 1
    # NumPy: the loss is the mean prediction, so every update subtracts lr x the mean features.
    gradient = saved["x"].astype(np.float32).mean(axis=0).reshape(-1, 1)
    kernel = np.ones_like(gradient)
    for _ in range(updates):
        kernel = kernel - lr * gradient
    np.testing.assert_allclose(saved["kernel"], kernel, rtol=0, atol=1e-6)
    # One update more (or less) would move a weight by over 1000 x the tolerance.
    assert np.abs(lr * gradient).max() > 1e-3
    if exactly_once:
        assert int(saved["iterations"]) == steps
        # Counted once on the ps: Keras 3's loop did not have to set the count to the steps.
        assert "optimizer.iterations counted" not in cluster.output
        # The lost step is in the second epoch: its metric counted each of its examples once.
        assert float(saved["metric_count"]) == steps // 2 * int(saved["batch"])
    return cluster


@pytest.mark.timeout(260)
@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly_once", "at_least_once"])
@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_a_step_whose_worker_is_lost_after_its_update_landed_is_applied_once(tmp_path, legacy, exactly_once):
    cluster = run_lost(tmp_path, "lost_after_update", legacy, exactly_once)
    if exactly_once:
        assert "found them applied and skipped them" in cluster.output


@pytest.mark.timeout(260)
@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_a_worker_lost_while_sending_its_step_leaves_nothing_of_it_written(tmp_path, legacy):
    # Its gradient reached the parameter server, the rest of the step's values never did: no
    # write of the step began, nothing was marked, and the re-run applied it once.
    cluster = run_lost(tmp_path, "lost_sending", legacy)
    assert "found them applied and skipped them" not in cluster.output
    assert "not one unit" not in cluster.output


@pytest.mark.timeout(260)
@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_a_worker_lost_while_the_server_writes_its_step_has_it_applied_once(tmp_path, legacy):
    # The worker died while the server was between the step's update and its mark
    # (tests/workers/async_writing.py; the unit's stretches are matrix products, not loops, which
    # the worker's loss would stop): the server finished the unit, and the re-run found it.
    cluster = run_lost(tmp_path, "lost_writing", legacy)
    assert "found them applied and skipped them" in cluster.output
    assert "lost while its step was written" in cluster.output
    assert_held_open(tmp_path, "lost_writing")


def assert_held_open(tmp_path, scenario):
    """The lost unit's last stretch of work ended over a second after its worker aborted (the
    server's clock and the worker's are this machine's): the window was open when it died."""
    aborted = float((tmp_path / f"{scenario}.aborted").read_text())
    ended = float(np.load(tmp_path / f"{scenario}.npz")["ended"])
    assert ended - aborted > 1.0, (aborted, ended)


@pytest.mark.timeout(260)
@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_a_worker_lost_while_the_server_writes_its_step_counted_inside_the_unit(tmp_path, legacy):
    # lost_writing with counters on the server inside the unit of the step lost, each bump
    # ordered after the op before it: after its update, after each stretch, after its mark, the
    # mark after an Identity of the last stretch's end (the shape that busy-wait loops had cut).
    # The lost unit runs to its end, over a second past its worker's abort, and the re-run is
    # skipped: every counter 1, where a cut unit and an applied re-run would count 2 updates.
    cluster, saved = finish_lost(tmp_path, "lost_writing_counted", legacy)
    assert int(saved["fired"]) == 1  # the step's worker was lost
    assert re.search(r"\[launch\] worker:\d exited with status -6", cluster.output), cluster.output[-6000:]
    assert_held_open(tmp_path, "lost_writing_counted")
    assert saved["counted"].tolist() == [1, 1, 1, 1], saved["counted"]
    assert int(saved["iterations"]) == int(saved["steps"])
    assert "found them applied and skipped them" in cluster.output
