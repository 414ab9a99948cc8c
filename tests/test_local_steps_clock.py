"""Speed-proportional local steps time the step's own work: a rank slowed inside its steps (the
trainer's emulated compute, read with each batch) makes its group run fewer steps a round, as
the speed rule says from the real step times, not from the exchange's own bookkeeping."""
import json
import os

import pytest

from tests.conftest import PYTHON, REPO, run_checked
from tfsync_testbed import localrun

TRAIN = os.path.join(REPO, "scripts", "train.py")
pytestmark = pytest.mark.slow
PERIOD, SLOW = 8, 4


@pytest.mark.timeout(300)
def test_a_group_slowed_inside_its_steps_runs_fewer_steps_a_round(tmp_path):
    # Ranks 0,1 and 2,3 are the groups; rank 1 waits 4x the others' 50 ms in every step.
    command = [PYTHON, TRAIN, "--sync_mode=hybrid", "--sync_group_size=2", f"--sync_period={PERIOD}",
               "--epochs=2", "--compute_ms=200", f"--compute_slow_worker=1:{SLOW}",
               f"--model_dir={tmp_path / 'run'}", f"--metrics_file={tmp_path / 'metrics.json'}"]
    run_checked(localrun.horovodrun_command(4, command), timeout=260)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    slow, fast = metrics["local_steps_group0"][-1], metrics["local_steps_group1"][-1]
    # The rule: the fastest group runs the period, the other round(period * t_fast / t_slow).
    # The slow group's steps take at least SLOW x 50 ms against the fast group's 50 ms plus their
    # exchange, so it runs at most about half the fast group's steps. A clock that leaves the
    # step's compute out sees equal groups (6-7 steps against 7-8).
    assert fast >= PERIOD - 2, metrics
    assert slow <= 0.5 * fast, metrics
