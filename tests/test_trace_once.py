"""A fit through ``strategy.fit`` under Horovod traces its train step once: the compiled
metrics' variables are made before the first step (tfsyncmodes.keras.compat.build_metrics), so
``tf.function`` has no variables of the first trace to lift and no reason to trace again. The
same model given to ``model.fit`` by the script itself, where the metrics are made inside the
first trace, is the control: there the counter sees two traces."""
import json
import os

import pytest

from tests.conftest import PYTHON, WORKERS, run_checked
from tfsync_testbed import localrun


@pytest.mark.slow  # a horovodrun job
@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode,legacy", [("sync", False), ("hybrid", True)], ids=["sync-keras3", "hybrid-tf_keras"])
def test_a_strategy_fit_traces_its_train_step_once(mode, legacy):
    command = localrun.horovodrun_command(2, [PYTHON, os.path.join(WORKERS, "trace_count.py"), mode])
    result = run_checked(command, timeout=170, **({"TF_USE_LEGACY_KERAS": "1"} if legacy else {}))
    out = [json.loads(line.split("RESULT ", 1)[1]) for line in result.stdout.splitlines() if "RESULT " in line]
    assert sorted(r["rank"] for r in out) == [0, 1], result.stdout[-2000:]
    for r in out:
        assert r["traces"] == {"strategy_fit": 1, "model_fit": 2}, r
