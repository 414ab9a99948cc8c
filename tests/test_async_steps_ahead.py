"""``--sync_steps_ahead``: Keras 3's async loop schedules the next epoch's first steps before it
waits for an epoch's last steps, so the workers done go on while those end and while the chief
checkpoints and evaluates.
On a real 2-worker gRPC cluster (tests/workers/async_steps_ahead.py): the steps and examples
each epoch counts, what the callbacks saw, the final kernel against NumPy, and a run a
callback stops, with the option off (as Keras' fit) and on."""
import json
import os

import numpy as np
import pytest

from tests.conftest import PYTHON, WORKERS
from tests.test_async import Cluster
from tests.workers.async_steps_ahead import BATCH, EPOCHS, LR, STEPS, data

pytestmark = pytest.mark.slow

AHEAD = 6


def numpy_kernel(updates):
    """Plain SGD on the mean of x @ w: every update subtracts LR x the batch's mean features."""
    x = data().astype(np.float64)
    return np.ones(x.shape[1]) - updates * LR * x.mean(axis=0)


def run(tmp_path, ahead):
    cluster = Cluster(["--workers", "2", "--ps", "1", "--timeout", "170"],
                      [PYTHON, os.path.join(WORKERS, "async_steps_ahead.py"), str(tmp_path), str(ahead)])
    assert cluster.finish(190) == 0, cluster.output[-6000:]
    return json.loads((tmp_path / "steps_ahead.json").read_text()), cluster.output


@pytest.mark.timeout(220)
def test_without_steps_ahead_the_workers_wait_for_the_epoch_end_callbacks(tmp_path):
    results, _ = run(tmp_path, 0)
    full = results["full"]
    for number, epoch in enumerate(full["epochs"]):
        done = (number + 1) * STEPS
        # Nothing ran while the callback paused: every step of the epoch and no other.
        assert epoch["at_entry"] == epoch["after_pause"] == done, full["epochs"]
        assert epoch["seen"] == STEPS * BATCH and epoch["steps"] == STEPS, epoch
    assert full["returned"] == full["later"] == EPOCHS * STEPS
    np.testing.assert_allclose(full["kernel"], numpy_kernel(EPOCHS * STEPS), rtol=0, atol=1e-5)


@pytest.mark.timeout(220)
def test_steps_ahead_run_during_the_epoch_end_and_count_in_the_next_epoch(tmp_path):
    results, output = run(tmp_path, AHEAD)
    full = results["full"]
    for number, epoch in enumerate(full["epochs"]):
        done = (number + 1) * STEPS
        last = number == EPOCHS - 1
        # By the callback's end the next epoch's first AHEAD steps had run (none after the last).
        assert done <= epoch["at_entry"] <= epoch["after_pause"], full["epochs"]
        assert epoch["after_pause"] == done + (0 if last else AHEAD), full["epochs"]
        # Each epoch still counts its own steps and examples: those run ahead in the next.
        assert epoch["seen"] == STEPS * BATCH and epoch["steps"] == STEPS, epoch
        # The callbacks began once the epoch's own steps were done, not the steps ahead: worker
        # 1 (slow) ran one of those, worker 0 fewer than AHEAD in its time.
        assert last or epoch["at_entry"] < done + AHEAD, full["epochs"]
    assert full["history_epochs"] == list(range(EPOCHS))
    assert full["returned"] == full["later"] == EPOCHS * STEPS
    np.testing.assert_allclose(full["kernel"], numpy_kernel(EPOCHS * STEPS), rtol=0, atol=1e-5)

    # A callback stops training at the first epoch's end: the steps scheduled ahead of it have
    # run when fit returns (none is left running), and a line says so.
    stopped = results["stopped"]
    assert stopped["history_epochs"] == [0]
    assert stopped["returned"] == stopped["later"] == STEPS + AHEAD, stopped
    np.testing.assert_allclose(stopped["kernel"], numpy_kernel(STEPS + AHEAD), rtol=0, atol=1e-5)
    assert f"the {AHEAD} step(s) of the next epoch scheduled ahead of it (steps_ahead) ran" in output
