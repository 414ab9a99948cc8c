"""Sync mode under ``horovodrun -np 2`` with a quantizing compression (int8, topk_int2) and with
Top-K under DGC's corrections, against a NumPy replay of the steps: every rank holds the same
bits, the weights are the replay's, and the bytes in the History are the quantized payload's."""
import os

import numpy as np
import pytest

from tests import reference, reference_compression as ref
from tests.conftest import PYTHON, WORKERS, run_checked
from tfsync_testbed import localrun

SIZE = reference.FEATURES * reference.OUTPUTS + reference.OUTPUTS
STEPS, RATIO = 4, 0.25


def run_sync(tmp_path, num_proc, **env):
    command = localrun.horovodrun_command(num_proc, [PYTHON, os.path.join(WORKERS, "sync_steps.py"), str(tmp_path),
                                                     f"--steps={STEPS}"])
    run_checked(command, timeout=200, **env)
    workers = [np.load(tmp_path / f"worker{i}.npz") for i in range(num_proc)]
    for w in workers:
        assert int(w["iterations"]) == STEPS
        np.testing.assert_array_equal(w["kernel"], workers[0]["kernel"])  # the same bits everywhere
        np.testing.assert_array_equal(w["bias"], workers[0]["bias"])
    return workers


def check_weights(worker, kernel, bias):
    np.testing.assert_allclose(worker["kernel"], kernel, rtol=0, atol=1e-6)
    np.testing.assert_allclose(worker["bias"], bias, rtol=0, atol=1e-6)
    dense_kernel, _ = reference.mean_gradient_training(worker["kernel0"], worker["bias0"],
                                                       *reference.linear_data(STEPS, 2))
    assert np.abs(worker["kernel"] - dense_kernel).max() > 1e-4  # compression changed the update


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["int8", "topk_int2"])
@pytest.mark.timeout(240)
def test_quantized_sync_steps_equal_numpy(tmp_path, compression):
    workers = run_sync(tmp_path, 2, TFSYNC_COMPRESSION=compression, TFSYNC_TOPK_RATIO=RATIO)
    x, y = reference.linear_data(STEPS, 2)
    kernel, bias = ref.compressed_sync_training(workers[0]["kernel0"], workers[0]["bias0"], x, y,
                                                compression, RATIO)
    check_weights(workers[0], kernel, bias)
    k = int(np.ceil(RATIO * SIZE))
    wire = SIZE + 8 if compression == "int8" else -(-k // 4) + 8 + 4 * k
    assert float(workers[0]["bytes_sent"]) == wire


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_dgc_sync_steps_equal_numpy(tmp_path):
    ratio, warmup, clip = 0.1, 2, 0.5  # steps 0-1 send 25 % of the entries, then 10 %
    workers = run_sync(tmp_path, 2, TFSYNC_COMPRESSION="topk", TFSYNC_TOPK_RATIO=ratio, TFSYNC_DGC="on",
                       TFSYNC_DGC_MOMENTUM=0.9, TFSYNC_DGC_CLIP_NORM=clip, TFSYNC_DGC_WARMUP_STEPS=warmup)
    x, y = reference.linear_data(STEPS, 2)
    kernel, bias = ref.compressed_sync_training(workers[0]["kernel0"], workers[0]["bias0"], x, y, "topk", ratio,
                                                dgc=True, momentum=0.9, clip_norm=clip, warmup_steps=warmup)
    check_weights(workers[0], kernel, bias)
    # The History holds the epoch's mean of the steps' bytes: 2 steps of k = 5, 2 of k = 2.
    warm, final = int(np.ceil(0.25 * SIZE)), int(np.ceil(ratio * SIZE))
    assert float(workers[0]["bytes_sent"]) == 8 * (warm + final) / 2
