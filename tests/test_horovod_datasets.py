"""A Horovod rank's batches from ``experimental_distribute_dataset`` (its part of every global
batch, as MirroredStrategy splits one) and ``distribute_datasets_from_function`` (its own
pipeline), against NumPy's split of the same rows, whatever options a script passes:
``tf.distribute.InputOptions`` (as tf.distribute's strategies take, and as ``strategy.fit``
passes on) change nothing for a rank, ``tf.data.Options`` are applied to its dataset."""
import json
import os

import numpy as np
import pytest

from tests.conftest import PYTHON, WORKERS, run_checked
from tfsync_testbed import localrun


@pytest.mark.slow  # a horovodrun job
@pytest.mark.timeout(200)
def test_a_rank_gets_its_batches_with_either_kind_of_options():
    command = localrun.horovodrun_command(2, [PYTHON, os.path.join(WORKERS, "horovod_datasets.py")])
    out = sorted((json.loads(line.split("RESULT ", 1)[1]) for line in run_checked(command, timeout=170).stdout.splitlines()
                  if "RESULT " in line), key=lambda r: r["rank"])
    assert [r["rank"] for r in out] == [0, 1] and {r["size"] for r in out} == {2}
    rows = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    for r in out:
        rank = r["rank"]
        # Every global batch of 4 rows split in two: rank 0 the first 2 rows, rank 1 the next 2.
        split = [rows[i + 2 * rank:i + 2 * rank + 2] for i in range(0, 16, 4)]
        # Its own pipeline: every second row from its index, in batches of 4 // 2.
        own = rows[rank::2]
        own = [own[i:i + 2] for i in range(0, len(own), 2)]
        for name in ("none", "input_options", "data_options"):
            seen = r["seen"][name]
            assert all(np.array_equal(a, b) for a, b in zip(seen["distribute_dataset"], split, strict=True)), (name, seen)
            assert all(np.array_equal(a, b) for a, b in zip(seen["from_function"], own, strict=True)), (name, seen)
        assert r["seen"]["data_options"]["data_options_kept"]
