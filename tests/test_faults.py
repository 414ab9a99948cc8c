"""``--sync_slow_worker`` is a feature of its own (:mod:`tfsyncmodes.faults`): which worker gets which
fault callback, and that a strategy adds it explicitly in ``callbacks()`` and ``fit()``, not
among the callbacks the mode requires for correctness."""
import json

import numpy as np
import pytest

from tests.conftest import PYTHON, REPO, clean_env
from tfsyncmodes import config, faults
from tfsyncmodes.faults import SlowWorker
from tfsync_testbed import localrun


def resolved(**knobs):
    return config.resolve(knobs, environ={}, use_flags=False)


def test_callbacks_for_names_one_worker():
    windowed = resolved(mode="hybrid", slow_worker="1:4@30%-60%")
    assert faults.callbacks_for(windowed, 0) == []
    [slow] = faults.callbacks_for(windowed, 1)
    assert isinstance(slow, SlowWorker) and slow.factor == 4.0 and slow.window == (0.3, 0.6)
    assert faults.callbacks_for(resolved(mode="sync"), 0) == []


def test_async_workers_are_throttled_not_called_back():
    plain = resolved(mode="async", slow_worker="1:4")
    assert faults.callbacks_for(plain, 1) == []  # its process is throttled instead (throttle_self)
    assert faults.slow_worker_factor(plain, 1) == 4.0 and faults.slow_worker_factor(plain, 0) == 1.0


SCRIPT = """
import json
import tfsyncmodes
from tfsyncmodes import config

for knob in ("0:3", "1:3"):
    strategy = tfsyncmodes.make_strategy(config=config.resolve(
        {"mode": "sync", "backend": "mirrored", "slow_worker": knob}, environ={}, use_flags=False))
    names = lambda callbacks: [type(c).__name__ for c in callbacks]
    print(json.dumps({"knob": knob, "required": names(strategy.required_callbacks()),
                      "callbacks": names(strategy.callbacks()),
                      "fit": names(strategy.with_required_callbacks(["mine"]))}))
"""


@pytest.mark.timeout(120)
def test_strategy_adds_the_fault_callbacks_explicitly():
    result = localrun.run([PYTHON, "-c", SCRIPT], timeout=100, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    got = {row["knob"]: row for row in map(json.loads, result.stdout.strip().splitlines()[-2:])}
    assert "SlowWorker" not in got["0:3"]["required"]
    assert got["0:3"]["callbacks"] == got["0:3"]["required"] + ["SlowWorker"]
    assert got["0:3"]["fit"] == got["0:3"]["required"] + ["SlowWorker", "str"]
    assert "SlowWorker" not in got["1:3"]["callbacks"] + got["1:3"]["fit"]  # another worker's fault


def test_a_slow_step_takes_factor_times_its_own_time_and_a_trace_is_not_slowed(monkeypatch):
    """SlowWorker's sleeps, from the step times it measures: each step's own time times
    (factor - 1), a one-off step (over 3x the median of the earlier ones: a retrace) counted as
    3x that median, and the run's first step (its trace, nothing to compare with) not slowed.
    The clock is the test's, so the sleeps are exact."""
    steps = [2.0, 0.1, 0.12, 0.08, 1.5, 0.1]  # a trace, three steps, a retrace, a step
    factor = 4.0
    expected = []
    for k, seconds in enumerate(steps):  # the rule written out, with NumPy's median
        if k:
            expected.append((factor - 1) * min(seconds, 3.0 * float(np.median(steps[:k]))))
    now, slept = [0.0], []
    monkeypatch.setattr(faults.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    slow = SlowWorker(factor)
    slow.on_train_begin()
    slow.on_epoch_begin(0)
    for batch, seconds in enumerate(steps):
        slow.on_train_batch_begin(batch)
        now[0] += seconds
        slow.on_train_batch_end(batch, {})
    assert slept == pytest.approx(expected, rel=1e-12) and len(slept) == len(steps) - 1
