"""``python -m benchmarks.compare_modes``: a tiny real comparison (horovodrun and a local ps
cluster, one worker killed midway) whose JSON, table and PNGs must hold measured numbers; and
the pieces of its report checked against NumPy."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import PYTHON, REPO, clean_env

SCRIPT = [sys.executable, "-m", "benchmarks.compare_modes"]  # as a user runs it, from the root


def test_modes_and_policies_come_from_the_package():
    from benchmarks import comparelib
    from tfsyncmodes import config, registry

    assert comparelib.accepted_values("mode") == list(registry.MODES.names())
    for key in ("compression", "cross_group"):
        values = comparelib.accepted_values(key)
        assert config.KNOBS_BY_KEY[key].default in values
        for value in values:
            assert config.KNOBS_BY_KEY[key].parse(value) == value


def test_plan_has_every_mode_and_swept_policy():
    from benchmarks import comparelib
    from tfsyncmodes import config, registry

    result = subprocess.run([*SCRIPT, "--dry_run", "--sweep=compression,cross_group",
                             "--variant=hybrid-s8=hybrid:staleness=8", "--conditions=equal,slow,kill_ps"],
                            capture_output=True, text=True, timeout=120, cwd=REPO, env=clean_env())
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("[")]
    columns = {line.split("] ", 1)[1].split(" / ")[0] for line in lines}
    swept = {f"hybrid {key}={value}" for key in ("compression", "cross_group")
             for value in comparelib.accepted_values(key)
             if value != config.KNOBS_BY_KEY[key].default}
    assert columns == set(registry.MODES.names()) | swept | {"hybrid-s8"}
    assert any("hybrid-s8 / equal" in line and "--sync_staleness=8" in line for line in lines)
    # kill_ps only where there is a ps; the async individual rates come with the slow condition
    assert [line.split("] ", 1)[1].split(":")[0] for line in lines if "kill_ps" in line] == ["async / kill_ps"]
    assert any("async / solo slow" in line and "--sync_slow_worker=0:4" in line and "of 1:" in line for line in lines)
    assert any("sync / emulated slow" in line and "--compute_slow_worker=1:4" in line for line in lines)


def test_a_rerun_is_said_to_resume_from_the_epochs_it_trained():
    """A rerun's curve, read from the model dir, also holds the first run's epochs (the backup's
    History comes back with it): whether it resumed is read from the epochs it trained."""
    from benchmarks.compare_report import _kill_outcome

    curve = [{"epoch": e, "wall_time": 100.0 + e, "loss": 1.0 / (e + 2)} for e in range(-1, 10)]
    killed = {"killed_at_seconds": 19.0, "killed_after_epoch": 5, "wall_seconds": 25.0, "returncode": 1,
              "error": "RuntimeError: Horovod detected ..."}
    resumed = _kill_outcome(dict(killed, rerun={"wall_seconds": 20.0, "returncode": 0, "curve": curve,
                                                "metrics": {"epochs_run": [5, 6, 7, 8, 9]}}), 30.0)
    assert (resumed["resumed"], resumed["rerun_first_epoch"], resumed["extra_seconds"]) == (True, 5, 15.0)
    over = _kill_outcome(dict(killed, rerun={"wall_seconds": 40.0, "returncode": 0, "curve": curve,
                                             "metrics": {"epochs_run": list(range(10))}}), 30.0)
    assert (over["resumed"], over["rerun_first_epoch"]) == (False, 0)


def test_bytes_per_exchange_count_the_rounds_each_group_really_ran():
    """Hybrid's logs give, per epoch, the mean over ranks of a rank's payload bytes over its
    steps. With speed-proportional local steps and epoch-end rounds a group runs fewer steps a
    round than the period: each exchange is still one payload of `per_exchange` times dense."""
    from benchmarks.compare_report import _bytes

    dense = 4 * 1000
    for per_exchange in (1.0, 0.02):  # a dense model average; Top-K 1 % (values and indices)
        # Two groups of one rank, 3 rounds an epoch; group 0 ran 14 then 19 steps, group 1 22.
        steps = np.array([[14, 22], [19, 22]])
        sent = 3 * per_exchange * dense / steps  # bytes a step, per rank and epoch
        metrics = {"params": 1000, "bytes_sent": sent.mean(axis=1).tolist(),
                   "compression_ratio": (sent / dense).mean(axis=1).tolist(),
                   "local_steps_group0": (steps[:, 0] / 3).tolist(), "local_steps_group1": (steps[:, 1] / 3).tolist()}
        flags = ["--sync_group_size=1"] + (["--sync_compression=topk"] if per_exchange < 1 else [])
        got = _bytes({"flags": flags, "metrics": metrics, "on_ps": False})
        assert got["compression_ratio_per_exchange"] == pytest.approx(per_exchange, rel=1e-12)
        assert got["steps_per_exchange"] == pytest.approx(steps.mean() / 3, rel=1e-12)
        assert got["compression"] == ("topk" if per_exchange < 1 else "none")
    # No record of the rounds (fixed local steps): periodic exchanges every --sync_period steps.
    fixed = _bytes({"flags": ["--sync_period=4"], "on_ps": False,
                    "metrics": {"params": 1000, "bytes_sent": [1000.0], "compression_ratio": [0.25]}})
    assert (fixed["compression_ratio_per_exchange"], fixed["steps_per_exchange"]) == (1.0, 4.0)


def test_time_to_target_matches_numpy_interpolation():
    from benchmarks.compare_report import time_to

    rng = np.random.default_rng(0)
    times = np.cumsum(rng.uniform(0.5, 2.0, 12))
    losses = np.sort(rng.uniform(0.05, 2.0, 12))[::-1]  # falling
    points = [[float(t), float(v)] for t, v in zip(times, losses)]
    for target in (losses[3] + 1e-3, (losses[6] + losses[7]) / 2, losses[-1]):
        # np.interp needs increasing x: interpolate time as a function of falling loss.
        expected = float(np.interp(target, losses[::-1], times[::-1]))
        assert time_to(points, float(target)) == pytest.approx(expected, rel=1e-9)
    assert time_to(points, float(losses[-1]) / 2) is None


def test_bad_flag_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run([PYTHON, *SCRIPT[1:], "--modes=sync,bogus", f"--docs_dir={tmp_path}"],
                            capture_output=True, text=True, timeout=120, cwd=REPO, env=clean_env())
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("tfsyncmodes: error:")]
    from tfsyncmodes import registry

    accepted = ", ".join(registry.MODES.names())  # sync, async, hybrid, auto
    assert errors == [f"tfsyncmodes: error: flag: --modes: 'bogus' is not a mode; use some of {accepted}"]
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())


NUMBER = re.compile(r"\d+(\.\d+)?")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tiny_comparison_writes_numbers_table_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    docs = tmp_path / "docs"
    result = subprocess.run(
        [*SCRIPT, "--modes=sync,async", "--conditions=equal,kill", "--epochs=2",
         "--compute_ms=0", "--rerun_after_kill=false", "--timeout=300", f"--docs_dir={docs}",
         f"--python={PYTHON}"],  # the jobs' processes on the warm interpreter
        capture_output=True, text=True, timeout=840, cwd=REPO, env=clean_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    progress = [line for line in result.stdout.splitlines() if re.match(r"\[\d/4\] ", line)]
    assert len(progress) == 4 and all("min left" in line for line in progress), result.stdout[-3000:]

    data = json.loads((docs / "compare_modes.json").read_text())
    assert data["machine"]["cores"] == os.cpu_count()
    assert len(data["machine"]["load_average_before"]) == 3
    runs = {(r["column"], r["condition"]): r for r in data["runs"]}
    columns = data["summary"]["columns"]
    for mode in ("sync", "async"):
        raw = runs[(mode, "equal")]["metrics"]
        equal = columns[mode]["equal"]
        # throughput recomputed from the raw epoch ends: the second epoch's samples over its time
        ends = np.array([row["wall_time"] for row in runs[(mode, "equal")]["curve"] if row["epoch"] >= 0])
        expected = raw["steps_per_epoch"] * raw["batch_size"] / np.diff(ends)[0]
        assert equal["samples_per_s"] == pytest.approx(expected, abs=0.06)
        assert raw["steps"] == 2 * raw["steps_per_epoch"]
        assert 0.0 <= equal["test_accuracy"] <= 1.0 and math.isfinite(equal["final_loss"])
        assert len(equal["curve"]) == 2 and all(t > 0 and math.isfinite(v) for t, v in equal["curve"])
        assert equal["seconds_to_target"] is not None and equal["seconds_to_target"] > 0
    # bytes from the parameter count: float32 gradients (sync), variables read + gradients written (async)
    assert columns["sync"]["equal"]["bytes_per_step"] == 4 * runs[("sync", "equal")]["metrics"]["params"]
    assert columns["async"]["equal"]["bytes_per_step"] == 8 * runs[("async", "equal")]["metrics"]["params"]
    assert columns["async"]["equal"]["staleness_max"] >= columns["async"]["equal"]["staleness_mean"] >= 0

    # one worker killed after the first epoch: Horovod sync stops with an error, async finishes
    sync_kill, async_kill = columns["sync"]["kill"], columns["async"]["kill"]
    assert sync_kill["killed_after_epoch"] >= 1 and async_kill["killed_after_epoch"] >= 1
    assert sync_kill["ended"] == "stopped with an error" and sync_kill["error"]
    assert async_kill["ended"] == "finished" and 0.0 <= async_kill["test_accuracy"] <= 1.0
    assert math.isfinite(async_kill["extra_seconds"])

    table = (docs / "BENCHMARKS.md").read_text()
    assert "<!-- bench:compare_modes:begin -->" in table
    assert "| | sync | async |" in result.stdout and "| | sync | async |" in table
    for row in ("speed", "convergence", "fault tolerance", "communication"):
        line = next(line for line in table.splitlines() if line.startswith(f"| {row} |"))
        cells = [c.strip() for c in line.strip("|").split("|")[1:]]
        assert len(cells) == 2 and all(NUMBER.search(c) for c in cells), line
        assert not re.search(r"\bn/a\b|\bNone\b|\bnan\b|TODO|XXX", line), line

    import matplotlib.image

    for name in ("compare_modes_loss.png", "compare_modes_speed.png"):
        path = docs / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = matplotlib.image.imread(str(path))
        assert pixels.shape[0] > 300 and pixels.shape[1] > 600
        assert float(np.std(pixels[..., :3])) > 0.05  # drawn on, not a blank canvas


HOOKS = '''
import numpy as np


def build(num_features, num_classes):
    from tfsyncmodes.keras.compat import keras
    return keras.Sequential([keras.Input((num_features,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(num_classes)])


def load():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((320, 5))
    y = (x[:, 0] > 0).astype("int64")
    return x[:256], y[:256], x[256:], y[256:]
'''


def test_train_runs_your_own_model_and_data(tmp_path):
    (tmp_path / "myhooks.py").write_text(HOOKS)
    metrics = tmp_path / "metrics.json"
    env = clean_env()
    result = subprocess.run(
        [PYTHON, os.path.join(REPO, "scripts", "train.py"), "--model=myhooks:build", "--data=myhooks:load",
         "--epochs=2", "--batch_size=32", f"--model_dir={tmp_path / 'run'}", f"--metrics_file={metrics}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(metrics.read_text())
    assert got["params"] == 5 * 16 + 16 + 16 * 10 + 10  # Dense(16) on 5 features, Dense(10)
    assert got["steps_per_epoch"] == 256 // 32 and got["steps"] == 2 * 8
    assert 0.0 <= got["test_accuracy"] <= 1.0

    bad = subprocess.run([PYTHON, os.path.join(REPO, "scripts", "train.py"), "--model=myhooks:nothing"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert bad.returncode == 2
    assert [line for line in bad.stderr.splitlines() if line.startswith("tfsyncmodes: error:")] == [
        "tfsyncmodes: error: flag: --model: myhooks has no function 'nothing'; "
        "give --model=module:function with the module importable from the working directory"]
