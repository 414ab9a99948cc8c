"""Sync mode with --sync_compression under horovodrun, against NumPy: every rank applies the same
decompressed mean (identical weights), error feedback keeps what Top-K dropped, and the bytes
in the History are the payloads'. fp16 over two ranks is checked to float32 rounding, with and
without error feedback (a float16 sum of two values is the same in any order). tf.distribute
backends refuse compression."""
import math

import numpy as np
import pytest

from tests import reference, sync_jobs
from tfsyncmodes.errors import ConfigError

SIZE = reference.FEATURES * reference.OUTPUTS + reference.OUTPUTS


@pytest.mark.slow  # one horovodrun job per world size (tests/sync_jobs.py)
@pytest.mark.parametrize("num_proc, compression", [(2, "topk"), (4, "topk"), (4, "fp16"), (2, "topk_union"),
                                                   (4, "topk_union")])
@pytest.mark.timeout(330)
@sync_jobs.SHARED
def test_compressed_sync_steps_equal_numpy(tmp_path_factory, num_proc, compression):
    steps, ratio = 3, 0.25
    workers = sync_jobs.scenario(sync_jobs.job(num_proc, tmp_path_factory), compression, num_proc)
    x, y = reference.linear_data(steps, num_proc)
    kernel, bias = reference.compressed_mean_training(workers[0]["kernel0"], workers[0]["bias0"], x, y,
                                                      compression, ratio)
    dense_kernel, _ = reference.mean_gradient_training(workers[0]["kernel0"], workers[0]["bias0"], x, y)
    # Top-K sums float32 values exactly as NumPy does up to rounding. fp16 over 4 ranks sums
    # four float16 values in the order of Horovod's ring, which may round each partial sum
    # differently from NumPy's rank order: a bound of 3 float16 roundings of sums of ~10, over
    # 4 ranks and 3 steps at lr 0.1 (the exact fp16 checks are the two-rank ones below).
    tolerance = 1e-6 if compression.startswith("topk") else 2e-3
    for w in workers:  # sync_jobs.scenario checked the step count and the same bits everywhere
        np.testing.assert_allclose(w["kernel"], kernel, rtol=0, atol=tolerance)
        np.testing.assert_allclose(w["bias"], bias, rtol=0, atol=tolerance)
    if compression.startswith("topk"):  # compression really changed the update
        assert np.abs(workers[0]["kernel"] - dense_kernel).max() > 1e-3
    if compression == "topk":
        k = math.ceil(ratio * SIZE)
        assert float(workers[0]["bytes_sent"]) == 8 * k
        assert float(workers[0]["compression_ratio"]) == pytest.approx(8 * k / (4 * SIZE))
    elif compression == "topk_union":
        # Each rank sent its values at the union, which is more than its own k, and the update
        # differs from allgathered Top-K's (the replicas' selections differ).
        k = math.ceil(ratio * SIZE)
        assert float(workers[0]["bytes_sent"]) > 8 * k
        plain_kernel, _ = reference.compressed_mean_training(workers[0]["kernel0"], workers[0]["bias0"], x, y,
                                                             "topk", ratio)
        assert np.abs(workers[0]["kernel"] - plain_kernel).max() > 1e-4
    else:
        assert float(workers[0]["bytes_sent"]) == 2 * SIZE


@pytest.mark.slow  # the two-rank horovodrun job of tests/sync_jobs.py
@pytest.mark.timeout(330)
@sync_jobs.SHARED
def test_fp16_two_ranks_equals_numpy_float16_wire_with_and_without_error_feedback(tmp_path_factory):
    """Two ranks: each sends its compensated gradient as float16, the allreduce adds the two
    float16 values (one rounding, the same in either order), every rank divides the float32 of
    the sum by 2. NumPy doing just that matches to float32 rounding (measured: bit for bit);
    float32 on the wire, or error feedback dropped (or kept when switched off), is ~1e-5 away."""
    steps, tight = 3, 1e-6
    x, y = reference.linear_data(steps, 2)
    finals = {}
    outdir = sync_jobs.job(2, tmp_path_factory)
    for feedback in (True, False):  # scenarios with and without error_feedback=False
        workers = sync_jobs.scenario(outdir, "fp16_feedback" if feedback else "fp16_no_feedback", 2)
        start = workers[0]["kernel0"], workers[0]["bias0"]
        expected = reference.compressed_mean_training(*start, x, y, "fp16", error_feedback=feedback)
        other = reference.compressed_mean_training(*start, x, y, "fp16", error_feedback=not feedback)
        float32_wire = reference.mean_gradient_training(*start, x, y)
        # The check can tell the wrong runs apart: each is well beyond the tolerance.
        for wrong in (other, float32_wire):
            assert np.abs(np.asarray(wrong[0]) - expected[0]).max() > 10 * tight
        for w in workers:  # the step count and the same bits on both ranks: sync_jobs.scenario
            np.testing.assert_allclose(w["kernel"], expected[0], rtol=0, atol=tight)
            np.testing.assert_allclose(w["bias"], expected[1], rtol=0, atol=tight)
        assert float(workers[0]["bytes_sent"]) == 2 * SIZE  # float16 on the wire
        finals[feedback] = workers[0]["kernel"]
    assert np.abs(finals[True] - finals[False]).max() > 10 * tight  # the knob changed the run


@pytest.mark.parametrize("backend", ["mirrored", "multi_worker"])
def test_tf_distribute_backends_refuse_compression(backend):
    import tfsyncmodes

    config = tfsyncmodes.resolve({"mode": "sync", "backend": backend, "compression": "fp16"},
                                 environ={}, use_flags=False)
    with pytest.raises(ConfigError) as raised:
        tfsyncmodes.make_strategy(config=config)
    assert f"with the {backend} backend" in str(raised.value) and "horovodrun" in str(raised.value)


def test_compression_defaults_to_none_in_sync_and_hybrid():
    import tfsyncmodes

    assert tfsyncmodes.resolve({"mode": "sync"}, environ={}, use_flags=False).compression == "none"
    assert tfsyncmodes.resolve({"mode": "hybrid"}, environ={}, use_flags=False).compression == "none"
    given = tfsyncmodes.resolve({"mode": "hybrid"}, environ={"TFSYNC_COMPRESSION": "topk"}, use_flags=False)
    assert given.compression == "topk" and given.sources["compression"] == "environment"
