"""Sync mode with --sync_compression under horovodrun, against NumPy: every rank applies the same
decompressed mean (identical weights), error feedback keeps what Top-K dropped, and the bytes
in the History are the payloads'. fp16 over two ranks is checked to float32 rounding, with and
without error feedback (a float16 sum of two values is the same in any order). tf.distribute
backends refuse compression."""
import math
import os

import numpy as np
import pytest

from tests import reference
from tests.conftest import PYTHON, WORKERS, run_checked
from tfsyncmodes.errors import ConfigError
from tfsync_testbed import localrun

SIZE = reference.FEATURES * reference.OUTPUTS + reference.OUTPUTS


def run_sync_steps(tmp_path, num_proc, steps, *flags, **env):
    """The worker's steps under horovodrun -np `num_proc`; every rank's saved arrays."""
    command = localrun.horovodrun_command(num_proc, [PYTHON, os.path.join(WORKERS, "sync_steps.py"), str(tmp_path),
                                                     f"--steps={steps}", *flags])
    run_checked(command, timeout=200, **env)
    return [np.load(tmp_path / f"worker{i}.npz") for i in range(num_proc)]


@pytest.mark.parametrize("num_proc, compression", [(2, "topk"), (4, "topk"), (4, "fp16")])
@pytest.mark.timeout(240)
def test_compressed_sync_steps_equal_numpy(tmp_path, num_proc, compression):
    steps, ratio = 3, 0.25
    workers = run_sync_steps(tmp_path, num_proc, steps, TFSYNC_COMPRESSION=compression, TFSYNC_TOPK_RATIO=ratio)
    x, y = reference.linear_data(steps, num_proc)
    kernel, bias = reference.compressed_mean_training(workers[0]["kernel0"], workers[0]["bias0"], x, y,
                                                      compression, ratio)
    dense_kernel, _ = reference.mean_gradient_training(workers[0]["kernel0"], workers[0]["bias0"], x, y)
    # Top-K sums float32 values exactly as NumPy does up to rounding. fp16 over 4 ranks sums
    # four float16 values in the order of Horovod's ring, which may round each partial sum
    # differently from NumPy's rank order: a bound of 3 float16 roundings of sums of ~10, over
    # 4 ranks and 3 steps at lr 0.1 (the exact fp16 checks are the two-rank ones below).
    tolerance = 1e-6 if compression == "topk" else 2e-3
    for w in workers:
        assert int(w["iterations"]) == steps
        np.testing.assert_allclose(w["kernel"], kernel, rtol=0, atol=tolerance)
        np.testing.assert_allclose(w["bias"], bias, rtol=0, atol=tolerance)
        np.testing.assert_array_equal(w["kernel"], workers[0]["kernel"])  # the same bits everywhere
        np.testing.assert_array_equal(w["bias"], workers[0]["bias"])
    if compression == "topk":  # compression really changed the update
        assert np.abs(workers[0]["kernel"] - dense_kernel).max() > 1e-3
        k = math.ceil(ratio * SIZE)
        assert float(workers[0]["bytes_sent"]) == 8 * k
        assert float(workers[0]["compression_ratio"]) == pytest.approx(8 * k / (4 * SIZE))
    else:
        assert float(workers[0]["bytes_sent"]) == 2 * SIZE


@pytest.mark.timeout(300)
def test_fp16_two_ranks_equals_numpy_float16_wire_with_and_without_error_feedback(tmp_path):
    """Two ranks: each sends its compensated gradient as float16, the allreduce adds the two
    float16 values (one rounding, the same in either order), every rank divides the float32 of
    the sum by 2. NumPy doing just that matches to float32 rounding (measured: bit for bit);
    float32 on the wire, or error feedback dropped (or kept when switched off), is ~1e-5 away."""
    steps, tight = 3, 1e-6
    x, y = reference.linear_data(steps, 2)
    finals = {}
    for feedback in (True, False):
        out = tmp_path / f"feedback_{feedback}"
        out.mkdir()
        flags = () if feedback else ("--sync_error_feedback=false",)
        workers = run_sync_steps(out, 2, steps, *flags, TFSYNC_COMPRESSION="fp16")
        start = workers[0]["kernel0"], workers[0]["bias0"]
        expected = reference.compressed_mean_training(*start, x, y, "fp16", error_feedback=feedback)
        other = reference.compressed_mean_training(*start, x, y, "fp16", error_feedback=not feedback)
        float32_wire = reference.mean_gradient_training(*start, x, y)
        # The check can tell the wrong runs apart: each is well beyond the tolerance.
        for wrong in (other, float32_wire):
            assert np.abs(np.asarray(wrong[0]) - expected[0]).max() > 10 * tight
        for w in workers:
            assert int(w["iterations"]) == steps
            np.testing.assert_allclose(w["kernel"], expected[0], rtol=0, atol=tight)
            np.testing.assert_allclose(w["bias"], expected[1], rtol=0, atol=tight)
            np.testing.assert_array_equal(w["kernel"], workers[0]["kernel"])
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
