"""model.save / load_model round-trip the wrapped optimizer, under Keras 3 and tf_keras."""
import json
import os

import numpy as np
import pytest

from tests.conftest import PYTHON, WORKERS, run_checked


@pytest.mark.parametrize("legacy, wrapper", [(False, "SyncOptimizer"), (True, "SyncAdam")],
                         ids=["keras3", "tf_keras"])
@pytest.mark.timeout(150)
def test_wrapped_optimizer_round_trips(tmp_path, legacy, wrapper):
    run_checked([PYTHON, os.path.join(WORKERS, "save_load.py"), str(tmp_path)], timeout=120,
                TF_USE_LEGACY_KERAS="1" if legacy else "0")
    described = json.loads((tmp_path / "describe.json").read_text())
    assert described["saved"] == described["loaded"]
    assert described["loaded"]["class"] == wrapper
    assert described["loaded"]["inner_class"] == ("Adam" if not legacy else "SyncAdam")
    assert described["loaded"]["mode"] == "sync"
    assert described["loaded"]["iterations"] == 8
    assert described["loaded"]["learning_rate"] == pytest.approx(0.005)
    state = np.load(tmp_path / "state.npz")
    np.testing.assert_array_equal(state["saved_opt"], state["loaded_opt"])
    np.testing.assert_array_equal(state["saved_pred"], state["loaded_pred"])
    after = np.load(tmp_path / "after.npz")
    np.testing.assert_allclose(after["saved"], after["loaded"], rtol=0, atol=1e-6)
