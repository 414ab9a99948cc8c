"""An async worker reads its next batch when its step asks for it under the example trainer's
emulated compute (whose wait is in the batch), where tf.distribute's default reads one batch
ahead per worker: the next step's wait would run during this step's pull and push. Counted in
the batches each worker's pipeline of a real 2-worker gRPC cluster made in one epoch of
``strategy.fit``, under Keras 3 (tfsyncmodes' loop) and tf_keras (its ``DatasetCreator``)."""
import json
import os

import pytest

from tests.conftest import PYTHON, WORKERS
from tests.test_async import Cluster

pytestmark = pytest.mark.slow


@pytest.mark.timeout(200)
@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_emulated_compute_reads_no_batch_ahead_where_the_default_does(tmp_path, legacy):
    cluster = Cluster(["--workers", "2", "--ps", "1", "--timeout", "150"],
                      [PYTHON, os.path.join(WORKERS, "async_read_ahead.py"), str(tmp_path)],
                      **({"TF_USE_LEGACY_KERAS": "1"} if legacy else {}))
    assert cluster.finish(170) == 0, cluster.output[-6000:]
    counts = json.loads((tmp_path / "counts.json").read_text())
    # One batch per step the workers ran, and none made ahead of a step.
    assert counts["emulated_compute"]["made"] == counts["emulated_compute"]["steps"] == 12, counts
    # The default reads ahead (at least one batch beyond the steps, per worker that ran one):
    # what the options are there to stop, and what this test would see without them.
    assert counts["default"]["steps"] == 12 and counts["default"]["made"] > 12, counts
