"""Sync mode under ``horovodrun -np 2`` with a quantizing compression (int8, topk_int2) and with
Top-K under DGC's corrections, against a NumPy replay of the steps: every rank holds the same
bits, the weights are the replay's, and the bytes in the History are the quantized payload's."""
import numpy as np
import pytest

from tests import reference, reference_compression as ref, sync_jobs

SIZE = reference.FEATURES * reference.OUTPUTS + reference.OUTPUTS
STEPS, RATIO = 4, 0.25


def run_sync(tmp_path_factory, name):
    """Scenario `name` of the shared two-rank job (tests/sync_jobs.py): every rank ran STEPS
    steps and holds the same bits."""
    assert sync_jobs.JOBS[2][name]["steps"] == STEPS
    return sync_jobs.scenario(sync_jobs.job(2, tmp_path_factory), name, 2)


def check_weights(worker, kernel, bias):
    np.testing.assert_allclose(worker["kernel"], kernel, rtol=0, atol=1e-6)
    np.testing.assert_allclose(worker["bias"], bias, rtol=0, atol=1e-6)
    dense_kernel, _ = reference.mean_gradient_training(worker["kernel0"], worker["bias0"],
                                                       *reference.linear_data(STEPS, 2))
    assert np.abs(worker["kernel"] - dense_kernel).max() > 1e-4  # compression changed the update


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["int8", "topk_int2"])
@pytest.mark.timeout(330)
@sync_jobs.SHARED
def test_quantized_sync_steps_equal_numpy(tmp_path_factory, compression):
    workers = run_sync(tmp_path_factory, compression)
    x, y = reference.linear_data(STEPS, 2)
    kernel, bias = ref.compressed_sync_training(workers[0]["kernel0"], workers[0]["bias0"], x, y,
                                                compression, RATIO)
    check_weights(workers[0], kernel, bias)
    k = int(np.ceil(RATIO * SIZE))
    # topk_int2: 2-bit codes, [lo, scale], a uint16 low part an index and one int32 block count.
    wire = SIZE + 8 if compression == "int8" else -(-k // 4) + 8 + 2 * k + 4
    assert float(workers[0]["bytes_sent"]) == wire


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["int8", "topk_int8"])
@pytest.mark.timeout(330)
@sync_jobs.SHARED
def test_per_tensor_sync_steps_equal_numpy(tmp_path_factory, compression):
    """--sync_compression_per_tensor: the kernel and the bias each with a scale (topk_int8: a
    Top-K selection, at least one entry of the 3-entry bias) and a residual of their own, and
    the bytes both payloads; not the flat vector's update."""
    workers = run_sync(tmp_path_factory, f"{compression}_per_tensor")
    x, y = reference.linear_data(STEPS, 2)
    kernel, bias = ref.compressed_sync_training(workers[0]["kernel0"], workers[0]["bias0"], x, y, compression,
                                                RATIO, per_tensor=True)
    check_weights(workers[0], kernel, bias)
    flat_kernel, _ = ref.compressed_sync_training(workers[0]["kernel0"], workers[0]["bias0"], x, y, compression,
                                                  RATIO)
    assert np.abs(workers[0]["kernel"] - flat_kernel).max() > 1e-5  # one scale each, not one for the model
    sizes = [reference.FEATURES * reference.OUTPUTS, reference.OUTPUTS]
    _, wire = ref.per_tensor_roundtrip(np.ones(SIZE, np.float32), sizes, compression, RATIO)
    assert float(workers[0]["bytes_sent"]) == wire  # both payloads (int8: the codes and a [lo, scale] each)
    if compression == "int8":
        assert wire == SIZE + 2 * 8


@pytest.mark.slow
@pytest.mark.timeout(330)
@sync_jobs.SHARED
def test_dgc_sync_steps_equal_numpy(tmp_path_factory):
    ratio, warmup, clip = 0.1, 2, 0.5  # steps 0-1 send 25 % of the entries, then 10 %
    assert sync_jobs.JOBS[2]["dgc"] == dict(steps=STEPS, compression="topk", topk_ratio=ratio, dgc=True,
                                            dgc_momentum=0.9, dgc_clip_norm=clip, dgc_warmup_steps=warmup)
    workers = run_sync(tmp_path_factory, "dgc")
    x, y = reference.linear_data(STEPS, 2)
    kernel, bias = ref.compressed_sync_training(workers[0]["kernel0"], workers[0]["bias0"], x, y, "topk", ratio,
                                                dgc=True, momentum=0.9, clip_norm=clip, warmup_steps=warmup)
    check_weights(workers[0], kernel, bias)
    # The History holds the epoch's mean of the steps' bytes: 2 steps of k = 5, 2 of k = 2.
    warm, final = int(np.ceil(0.25 * SIZE)), int(np.ceil(ratio * SIZE))
    assert float(workers[0]["bytes_sent"]) == 8 * (warm + final) / 2


@pytest.mark.slow
@pytest.mark.timeout(330)
@sync_jobs.SHARED
def test_dgc_without_masking_sync_steps_equal_numpy(tmp_path_factory):
    """``dgc_masking=False``: the momentum u is kept where v was sent (the replay's masking off)."""
    ratio = 0.1
    assert sync_jobs.JOBS[2]["dgc_unmasked"] == dict(steps=STEPS, compression="topk", topk_ratio=ratio, dgc=True,
                                                     dgc_momentum=0.9, dgc_masking=False)
    workers = run_sync(tmp_path_factory, "dgc_unmasked")
    x, y = reference.linear_data(STEPS, 2)
    kernel, bias = ref.compressed_sync_training(workers[0]["kernel0"], workers[0]["bias0"], x, y, "topk", ratio,
                                                dgc=True, momentum=0.9, masking=False)
    check_weights(workers[0], kernel, bias)
    masked, _ = ref.compressed_sync_training(workers[0]["kernel0"], workers[0]["bias0"], x, y, "topk", ratio,
                                             dgc=True, momentum=0.9)
    assert np.abs(workers[0]["kernel"] - masked).max() > 1e-6  # the knob changed the update
