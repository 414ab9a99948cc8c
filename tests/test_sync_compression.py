"""Sync mode with --sync_compression under horovodrun, against NumPy: every rank applies the same
decompressed mean (identical weights), error feedback keeps what Top-K dropped, and the bytes
in the History are the payloads'. tf.distribute backends refuse compression."""
import math
import os

import numpy as np
import pytest

from tests import reference
from tests.conftest import PYTHON, WORKERS, run_checked
from tfsyncmodes.errors import ConfigError
from tfsync_testbed import localrun

SIZE = reference.FEATURES * reference.OUTPUTS + reference.OUTPUTS


@pytest.mark.parametrize("num_proc, compression", [(2, "topk"), (4, "topk"), (2, "fp16"), (4, "fp16")])
@pytest.mark.timeout(240)
def test_compressed_sync_steps_equal_numpy(tmp_path, num_proc, compression):
    steps, ratio = 3, 0.25
    command = localrun.horovodrun_command(num_proc, [PYTHON, os.path.join(WORKERS, "sync_steps.py"), str(tmp_path),
                                                     f"--steps={steps}"])
    run_checked(command, timeout=200, TFSYNC_COMPRESSION=compression, TFSYNC_TOPK_RATIO=ratio)
    workers = [np.load(tmp_path / f"worker{i}.npz") for i in range(num_proc)]
    x, y = reference.linear_data(steps, num_proc)
    kernel, bias = reference.compressed_mean_training(workers[0]["kernel0"], workers[0]["bias0"], x, y,
                                                      compression, ratio)
    dense_kernel, _ = reference.mean_gradient_training(workers[0]["kernel0"], workers[0]["bias0"], x, y)
    # Top-K sums float32 values exactly as NumPy does up to rounding; fp16 sums in float16 in an
    # order Horovod chooses, so within float16's precision of the summed gradients.
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
