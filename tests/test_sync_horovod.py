"""Sync mode over Horovod: real horovodrun jobs, checked against NumPy: the weights, one
grouped allreduce per step (Horovod's timeline), epoch metrics averaged over the ranks."""
import json
import os
import re

import numpy as np
import pytest

from tests import reference, sync_jobs
from tests.conftest import PYTHON, WORKERS, run_checked
from tfsync_testbed import localrun

pytestmark = pytest.mark.slow  # horovodrun jobs of 2 and 4 ranks


def load_workers(outdir, count):
    return [np.load(os.path.join(outdir, f"worker{i}.npz")) for i in range(count)]


def check_mean_gradient_training(workers, steps, optimizer, tolerance):
    replicas = int(workers[0]["replicas"])
    x, y = reference.linear_data(steps, replicas)
    kernel, bias = reference.mean_gradient_training(workers[0]["kernel0"], workers[0]["bias0"], x, y,
                                                    optimizer)
    for w in workers:
        assert int(w["iterations"]) == steps
        np.testing.assert_allclose(w["kernel"], kernel, atol=tolerance, rtol=0)
        np.testing.assert_allclose(w["bias"], bias, atol=tolerance, rtol=0)
        # Allreduce gives every rank the same bits: identical, not just close.
        np.testing.assert_array_equal(w["kernel"], workers[0]["kernel"])
        np.testing.assert_array_equal(w["bias"], workers[0]["bias"])


def timeline_events(path):
    """The events of a Horovod timeline (rank 0 writes it; the file may lack its closing bracket)."""
    text = path.read_text().rstrip().rstrip(",")
    return json.loads(text if text.endswith("]") else text + "]")


def timeline_allreduces(path):
    """{tensor name: number of ALLREDUCE operations} from a Horovod timeline (each tensor of a
    collective gets its own row, named after the op)."""
    events = timeline_events(path)
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("name") == "process_name" and "name" in e.get("args", {})}
    counts = {}
    for event in events:
        if event.get("ph") == "B" and event.get("name") == "ALLREDUCE":
            counts[names[event["pid"]]] = counts.get(names[event["pid"]], 0) + 1
    return counts


def timeline_broadcasts(path):
    """The number of BROADCAST operations in a Horovod timeline (eager broadcasts, as the initial
    state's are, all show as ``HorovodBroadcast``)."""
    return sum(1 for e in timeline_events(path) if e.get("ph") == "B" and e.get("name") == "BROADCAST")


def check_one_grouped_allreduce_per_step(timeline, steps, num_variables, epoch_metrics):
    counts = timeline_allreduces(timeline)
    grouped = {n: c for n, c in counts.items() if "HorovodGroupedAllreduce" in n}
    parts = [re.match(r"(.*HorovodGroupedAllreduce.*)_(\d+)of(\d+)$", n) for n in grouped]
    assert all(parts), grouped
    # One grouped op whose tensors are the model's gradients, each reduced once per step ...
    assert len({p.group(1) for p in parts}) == 1, grouped
    assert sorted(int(p.group(2)) for p in parts) == list(range(1, num_variables + 1))
    assert {int(p.group(3)) for p in parts} == {num_variables}
    assert set(grouped.values()) == {steps}, grouped
    # ... and no other allreduce but the epoch-end average of each logged metric.
    others = {n: c for n, c in counts.items() if n not in grouped}
    assert sum(others.values()) == epoch_metrics, others


def check_epoch_loss_is_the_mean_over_ranks(workers, steps, optimizer):
    replicas = int(workers[0]["replicas"])
    x, y = reference.linear_data(steps, replicas)
    losses = reference.mean_gradient_training_losses(workers[0]["kernel0"], workers[0]["bias0"], x, y,
                                                     optimizer)
    per_rank = losses.mean(axis=0)  # what each rank's loss metric holds at the epoch's end
    for w in workers:
        assert float(w["epoch_loss"]) == pytest.approx(per_rank.mean(), rel=1e-5)
    assert abs(per_rank[0] - per_rank.mean()) > 1e-3  # rank 0's own mean would show


@pytest.mark.parametrize("num_proc, optimizer", [(2, "sgd"), (4, "adam")])
@pytest.mark.timeout(240)
def test_horovod_wrapped_steps_equal_numpy_mean_gradient(tmp_path, num_proc, optimizer):
    command = localrun.horovodrun_command(num_proc, [
        PYTHON, os.path.join(WORKERS, "sync_steps.py"), str(tmp_path), f"--optimizer={optimizer}"])
    run_checked(command, timeout=200, HOROVOD_TIMELINE=tmp_path / "timeline.json")
    workers = load_workers(tmp_path, num_proc)
    assert all(str(w["backend"]) == "horovod" and int(w["replicas"]) == num_proc for w in workers)
    assert str(workers[0]["optimizer_class"]) == "SyncOptimizer"
    # Ranks start from different weights; the broadcast makes rank 0's the common start.
    assert np.abs(workers[0]["kernel0"] - workers[1]["kernel0"]).max() > 1e-3
    check_mean_gradient_training(workers, steps=3, optimizer=optimizer, tolerance=1e-5)
    check_one_grouped_allreduce_per_step(tmp_path / "timeline.json", steps=3, num_variables=2, epoch_metrics=1)
    check_epoch_loss_is_the_mean_over_ranks(workers, steps=3, optimizer=optimizer)


@pytest.mark.timeout(240)
def test_horovod_under_tf_keras(tmp_path):
    """tf_keras with Adam: the first broadcast sends the optimizer's slots too (tf_keras says an
    optimizer is built in `_built`, not `built`): kernel and bias, the step count, and Adam's two
    moments of each."""
    command = localrun.horovodrun_command(2, [
        PYTHON, os.path.join(WORKERS, "sync_steps.py"), str(tmp_path), "--optimizer=adam"])
    run_checked(command, timeout=200, TF_USE_LEGACY_KERAS=1, HOROVOD_TIMELINE=tmp_path / "timeline.json")
    workers = load_workers(tmp_path, 2)
    assert str(workers[0]["optimizer_class"]) == "SyncAdam"
    check_mean_gradient_training(workers, steps=3, optimizer="adam", tolerance=1e-5)
    check_one_grouped_allreduce_per_step(tmp_path / "timeline.json", steps=3, num_variables=2, epoch_metrics=1)
    check_epoch_loss_is_the_mean_over_ranks(workers, steps=3, optimizer="adam")
    assert timeline_broadcasts(tmp_path / "timeline.json") == 2 + 1 + 2 * 2


@pytest.mark.timeout(330)
@sync_jobs.SHARED
def test_strategy_reduce_sums_and_averages_over_the_ranks(tmp_path_factory):
    # Each rank contributes rank + 1, at the end of the shared two-rank job (tests/sync_jobs.py).
    outdir = sync_jobs.job(2, tmp_path_factory)
    results = [np.load(outdir / f"reduce.worker{rank}.npz") for rank in range(2)]
    assert [(rank, float(r["sum"]), float(r["mean"])) for rank, r in enumerate(results)] == [(0, 3.0, 1.5),
                                                                                             (1, 3.0, 1.5)]
