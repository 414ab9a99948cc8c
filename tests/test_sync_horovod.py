"""Sync mode over Horovod: real horovodrun jobs, checked against NumPy."""
import os

import numpy as np
import pytest

from tests import reference
from tests.conftest import PYTHON, WORKERS, run_checked
from tfsyncmodes.testing import localrun


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


@pytest.mark.parametrize("num_proc, optimizer", [(2, "sgd"), (4, "adam")])
@pytest.mark.timeout(240)
def test_horovod_wrapped_steps_equal_numpy_mean_gradient(tmp_path, num_proc, optimizer):
    command = localrun.horovodrun_command(num_proc, [
        PYTHON, os.path.join(WORKERS, "sync_steps.py"), str(tmp_path), f"--optimizer={optimizer}"])
    run_checked(command, timeout=200)
    workers = load_workers(tmp_path, num_proc)
    assert all(str(w["backend"]) == "horovod" and int(w["replicas"]) == num_proc for w in workers)
    assert str(workers[0]["optimizer_class"]) == "SyncOptimizer"
    # Ranks start from different weights; the broadcast makes rank 0's the common start.
    assert np.abs(workers[0]["kernel0"] - workers[1]["kernel0"]).max() > 1e-3
    check_mean_gradient_training(workers, steps=3, optimizer=optimizer, tolerance=1e-5)


@pytest.mark.timeout(240)
def test_horovod_under_tf_keras(tmp_path):
    command = localrun.horovodrun_command(2, [
        PYTHON, os.path.join(WORKERS, "sync_steps.py"), str(tmp_path)])
    run_checked(command, timeout=200, TF_USE_LEGACY_KERAS=1)
    workers = load_workers(tmp_path, 2)
    assert str(workers[0]["optimizer_class"]) == "SyncSGD"
    check_mean_gradient_training(workers, steps=3, optimizer="sgd", tolerance=1e-5)
