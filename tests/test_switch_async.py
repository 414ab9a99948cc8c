"""A mode schedule through async: the mode-neutral checkpoint, the plan at epoch ends, bad
input, and one launched sync -> async -> sync run on digits (horovodrun, then a ps cluster, then
horovodrun), checked against NumPy."""
import json
import os
import re

import numpy as np
import psutil
import pytest

from tests.conftest import PYTHON, REPO, clean_env, processes_left
from tests import events
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.switching.phases import checkpoint, plan
from tfsyncmodes.switching.phases.plan import EpochPhase
from tfsync_testbed import localrun

LAUNCH = os.path.join(REPO, "tfsyncmodes", "launch.py")


def test_phases_meet_at_epoch_ends():
    assert plan.epoch_phases("sync:1e,async:1e,sync", 3, 22) == [
        EpochPhase(0, "sync", 0, 1), EpochPhase(1, "async", 1, 2), EpochPhase(2, "sync", 2, 3)]
    # 10 % of 3 epochs rounds to none, but a phase keeps one epoch while epochs remain.
    assert plan.epoch_phases("sync:10%,async", 3, 22) == [EpochPhase(0, "sync", 0, 1), EpochPhase(1, "async", 1, 3)]
    # Steps round to the nearest epoch end; a phase squeezed out merges its neighbours.
    assert plan.epoch_phases("async:30,hybrid:12", 4, 20) == [EpochPhase(0, "async", 0, 2), EpochPhase(1, "hybrid", 2, 4)]
    assert plan.epoch_phases("sync:1e,async:1e,sync", 1, 22) == [EpochPhase(0, "sync", 0, 1)]


def _config(**values):
    from tfsyncmodes.config import resolve

    return resolve(values, environ={}, use_flags=False)


def test_phase_context_and_its_bad_input(tmp_path):
    text = "sync:1e,async:1e,sync"
    with pytest.raises(ConfigError, match="passes through async.*tfsyncmodes.launch"):
        plan.context(_config(mode_schedule=text), 3, 10, environ={})
    assert plan.context(_config(mode_schedule="sync:1e,hybrid"), 3, 10, environ={}) is None  # in-process kind
    env = {plan.ENV_PHASE: "1", plan.ENV_DIR: str(tmp_path)}
    for raw, words in (("x", "not a phase index"), ("3", "past the last phase")):
        with pytest.raises(ConfigError, match=words):
            plan.context(_config(mode_schedule=text, mode="async"), 3, 10, environ=dict(env, **{plan.ENV_PHASE: raw}))
    first = plan.context(_config(mode_schedule=text, mode="sync"), 3, 10, environ=dict(env, **{plan.ENV_PHASE: "0"}))
    plan.write_json(os.path.join(tmp_path, plan.PLAN_FILE), first.plan_record())
    with pytest.raises(ConfigError, match="'sync' but phase 1 .* is 'async'"):
        plan.context(_config(mode_schedule=text, mode="sync"), 3, 10, environ=env)
    found = plan.context(_config(mode_schedule=text, mode="async"), 3, 10, environ=env)
    assert (found.phase, found.checkpoint_in()) == (EpochPhase(1, "async", 1, 2), os.path.join(tmp_path, "phase-0.npz"))
    with pytest.raises(ConfigError, match="plans other phases"):  # other flags than the first phase's
        plan.context(_config(mode_schedule=text, mode="async"), 4, 10, environ=env)


def _model(seed):
    import keras

    import tfsyncmodes

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(3)])
    model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.SGD(0.1, momentum=0.9), "sync"),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_checkpoint_round_trip_carries_weights_slots_and_steps_not_the_exchange(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 5)).astype("float32"), rng.integers(0, 3, 32)
    trained = _model(1)
    trained.fit(x, y, batch_size=8, epochs=1, verbose=0)  # 4 steps: momentum slots are non-zero
    path = os.path.join(tmp_path, "phase-0.npz")
    meta = checkpoint.save(trained, path, epoch=1, mode="sync", phase=0)
    assert meta["step"] == 4 and sorted(os.listdir(tmp_path)) == ["phase-0.npz"]
    saved_meta, arrays = checkpoint.load(path)
    assert saved_meta["digest"] == checkpoint.digest(arrays)
    # The inner SGD's variables, in order; nothing of the wrapper's exchange.
    names = [saved_meta["names"][k] for k in sorted(arrays) if k.startswith(checkpoint.OPTIMIZER)]
    inner = trained.optimizer.inner_optimizer
    assert names == [v.path for v in inner.variables] and saved_meta["optimizer"] == "SGD"
    assert [n.rsplit("/", 1)[1] for n in names] == ["iteration", "learning_rate"] + [
        f"{v.path.replace('/', '_')}_momentum" for v in trained.trainable_variables]
    assert not any(v.path in names for v in trained.optimizer._variables)
    for index, variable in enumerate(trained.weights):
        np.testing.assert_array_equal(arrays[f"model/{index:04d}"], np.asarray(variable))
    for index, variable in enumerate(inner.variables):
        np.testing.assert_array_equal(arrays[f"optimizer/{index:04d}"], np.asarray(variable))
    fresh = _model(2)  # another model, other variable paths (sequential_N/...): keys are positions
    assert not np.array_equal(np.asarray(fresh.weights[0]), arrays["model/0000"])
    restored = checkpoint.restore(fresh, path)
    assert restored["restored_digest"] == meta["digest"]
    assert int(np.asarray(fresh.optimizer.iterations)) == 4
    # Training on from the restored state is training on from the saved one (NumPy: same update).
    trained.fit(x[:8], y[:8], batch_size=8, epochs=1, verbose=0, shuffle=False)
    fresh.fit(x[:8], y[:8], batch_size=8, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(trained.weights, fresh.weights):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)
    np.savez(os.path.join(tmp_path, "bad.npz"), __meta__=np.array(json.dumps(saved_meta)),
             **dict(arrays, **{"model/0000": np.zeros((6, 4), "float32")}))
    # The error names the saved variable and this phase's by their paths, which depend on how
    # many models the process made before (sequential/..., sequential_1/...): read them here.
    target = _model(3)
    saved_name, target_name = saved_meta["names"]["model/0000"], target.weights[0].path
    assert saved_name == trained.weights[0].path and saved_name != target_name
    shape_error = (f"{re.escape(repr(saved_name))} has shape \\(6, 4\\), "
                   f"this phase's {re.escape(repr(target_name))} has \\(5, 4\\)")
    with pytest.raises(ConfigError, match=shape_error):
        checkpoint.restore(target, os.path.join(tmp_path, "bad.npz"))
    np.savez(os.path.join(tmp_path, "adam.npz"), __meta__=np.array(json.dumps(dict(saved_meta, optimizer="Adam"))),
             **arrays)
    with pytest.raises(ConfigError, match="holds a Adam optimizer's state, this phase's optimizer is SGD"):
        checkpoint.restore(_model(4), os.path.join(tmp_path, "adam.npz"))


def test_launcher_refuses_async_schedule_without_ps_or_with_sync_mode():
    # The launcher as a file (`-m tfsyncmodes.launch` runs the same code after importing the
    # package, and with it TensorFlow, whose C++ start-up lines would come first).
    result = localrun.run([PYTHON, LAUNCH, "--ps", "0", "--", PYTHON, "scripts/train.py",
                           "--sync_mode_schedule=sync:1e,async"], timeout=120, env=clean_env(), cwd=REPO)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "--ps: 0" in lines[0] and "use --ps 1 or more" in lines[0] and "Traceback" not in result.stderr
    result = localrun.run([PYTHON, LAUNCH, "--", PYTHON, "scripts/train.py", "--sync_mode=sync",
                           "--sync_mode_schedule", "sync:1e,async"], timeout=120, env=clean_env(), cwd=REPO)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "drop --sync_mode" in lines[0], result.stderr
    # tf_keras in every task: refused before any phase starts (not by each rank of phase 0).
    result = localrun.run([PYTHON, LAUNCH, "--", PYTHON, "scripts/train.py", "--sync_mode_schedule=sync:1e,async"],
                          timeout=120, env=clean_env(TF_USE_LEGACY_KERAS="1"), cwd=REPO)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "TF_USE_LEGACY_KERAS: 1" in lines[0] and "unset TF_USE_LEGACY_KERAS" in lines[0]


def test_train_py_refuses_a_schedule_through_async_outside_the_launcher():
    env = clean_env()
    del env["TF_CPP_MIN_LOG_LEVEL"]  # train.py then holds TensorFlow's C++ start-up lines back
    result = localrun.run([PYTHON, "scripts/train.py", "--sync_mode_schedule=sync:1e,async"], timeout=180,
                          env=env, cwd=REPO)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("tfsyncmodes: error: flag: mode_schedule:") and "tfsyncmodes.launch" in lines[0]


def _digits_head(count=512, seed=0):
    """train.py's training split (digits, seed 0), its first `count` examples."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float32"), digits.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    train = order[:len(x) * 4 // 5][:count]
    return x[train], y[train]


def _numpy_loss(arrays, x, y):
    """The MLP of train.py, forward in NumPy from a checkpoint's weights; mean cross-entropy."""
    weights = [arrays[k] for k in arrays if k.startswith(checkpoint.MODEL)]
    h = x.astype(np.float64)
    for layer in range(0, len(weights), 2):
        h = h @ weights[layer] + weights[layer + 1]
        if layer < len(weights) - 2:
            h = np.maximum(h, 0.0)
    top = h.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(h - top).sum(axis=1)) + top[:, 0] - h[np.arange(len(y)), y]))


def test_a_phase_starts_horovod_under_the_ranks_own_python():
    """A sync or hybrid phase runs Horovod's launcher as the ranks' interpreter's module (the
    Horovod they import), and the `horovodrun` script for a program that is not a Python."""
    from tfsyncmodes.switching.phases import launching

    for python in ("/opt/env/bin/python", "python3.11", PYTHON):
        assert launching.horovodrun_command(2, [python, "train.py"]) == [
            python, "-m", "horovod.runner.launch", "-np", "2", "-H", "localhost:2", "--gloo",
            "--network-interface", "lo", python, "train.py"]
    for program in ("./train.sh", "ipython"):
        command = launching.horovodrun_command(2, [program])
        assert os.path.basename(command[0]) == "horovodrun" and command[-1] == program, command


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_sync_async_sync_through_the_launcher(tmp_path):
    model_dir, phase_dir, metrics_file = tmp_path / "run", tmp_path / "phases", tmp_path / "metrics.json"
    # The launcher as a file: the same code as `-m tfsyncmodes.launch`, without importing the
    # package (and TensorFlow) into the launcher process.
    command = [PYTHON, LAUNCH, "--np", "2", "--workers", "1", "--ps", "1",
               "--phase_dir", str(phase_dir), "--timeout", "600", "--",
               PYTHON, "scripts/train.py", "--sync_mode_schedule=sync:1e,async:1e,sync", "--epochs=3",
               f"--model_dir={model_dir}", f"--metrics_file={metrics_file}", "--hidden_units=32",
               "--batch_size=32", "--learning_rate=0.1"]
    result = localrun.run(command, timeout=660, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
    assert "[launch] phase 0 (phases 0-2): sync on horovodrun -np 2" in result.stdout
    assert "[launch] phase 1 (phases 0-2): async on a cluster of 1 worker(s) and 1 ps" in result.stdout
    assert "[launch] all 3 phases done" in result.stdout
    assert not processes_left()  # every rank, task and launcher has exited
    # and no port of the async phase's cluster is still listening (in this network namespace:
    # where the launcher made a private one, that namespace has gone with its processes).
    ports = {int(address.rsplit(":", 1)[1]) for line in result.stdout.splitlines() if line.startswith("[launch] cluster ")
             for addresses in json.loads(line[len("[launch] cluster "):]).values() for address in addresses}
    assert len(ports) == 3
    listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert not ports & listening

    metrics = json.loads(metrics_file.read_text())
    steps_per_epoch = metrics["steps_per_epoch"]
    assert metrics["steps"] == 3 * steps_per_epoch  # the step count went on across phases
    assert metrics["epochs_run"] == [0, 1, 2] and metrics["modes"] == ["sync", "async", "sync"]
    assert [e["epoch"] for e in metrics["history"]] == [0, 1, 2] and len(metrics["losses"]) == 3
    phases = metrics["phases"]
    assert [(p["mode"], p["start_epoch"], p["end_epoch"], p["step"]) for p in phases] == [
        ("sync", 0, 1, steps_per_epoch), ("async", 1, 2, 2 * steps_per_epoch), ("sync", 2, 3, 3 * steps_per_epoch)]

    x, y = _digits_head()
    untrained = float(np.log(10.0))
    for before, after in zip(phases, phases[1:]):
        # Each phase restored exactly what the one before wrote (both ways: Horovod -> ps, ps -> Horovod).
        assert after["restored_from"] == f"phase-{before['phase']}.npz"
        assert after["restored_digest"] == after["written_digest"] == before["saved_digest"]
        assert after["restored_step"] == before["step"]
        meta, arrays = checkpoint.load(str(phase_dir / after["restored_from"]))
        assert meta["mode"] == before["mode"] and meta["epoch"] == after["start_epoch"]
        momenta = [arrays[k] for k, name in meta["names"].items() if name.endswith("_momentum")]
        assert len(momenta) == 6 and all(np.abs(m).sum() > 0 for m in momenta)  # SGD's slots carried
        # The loss across the switch, from the checkpoint's weights in NumPy: the last phase's
        # end and the next phase's start are the same model, far below an untrained one's.
        reference = _numpy_loss(arrays, x, y)
        assert before["loss_at_end"] == pytest.approx(reference, rel=1e-4)
        assert after["loss_at_start"] == pytest.approx(reference, rel=1e-4)
        assert reference < 0.5 * untrained
    # Each phase's epoch trains on from where the last one ended: the epoch losses keep falling.
    losses = metrics["losses"]
    assert losses[0] > losses[1] > losses[2] and losses[2] < 0.25 * untrained

    scalars = events.scalars(model_dir / "logs" / "train")
    assert scalars["phase"] == [0.0, 1.0, 2.0]  # the switch markers, at epochs 0, 1, 2
    assert len(scalars["epoch_loss"]) == 3
    assert sorted(os.listdir(phase_dir)) == ["history.json", "phase-0.npz", "phase-1.npz", "phase-2.npz",
                                             "phases.json"]


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_a_users_own_script_runs_a_schedule_through_async(tmp_path):
    """No phase plumbing in the script: strategy.callbacks() and strategy.fit() run the phase."""
    command = [PYTHON, LAUNCH, "--np", "2", "--workers", "1", "--ps", "1", "--phase_dir", str(tmp_path / "phases"),
               "--timeout", "600", "--", PYTHON, os.path.join(REPO, "tests", "workers", "schedule_user.py"),
               str(tmp_path / "run"), "--sync_mode_schedule=sync:1e,async:1e,sync"]
    result = localrun.run(command, timeout=660, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
    assert "[launch] all 3 phases done" in result.stdout
    phases = [json.loads(line.split("RESULT ", 1)[1]) for line in result.stdout.splitlines() if "RESULT " in line]
    assert [(p["mode"], p["epochs"], p["steps"]) for p in phases] == [
        ("sync", [0], 8), ("async", [1], 16), ("sync", [2], 24)]  # epochs and steps go on
    history = json.loads((tmp_path / "phases" / "history.json").read_text())
    assert [(e["epoch"], e["mode"]) for e in history["epochs"]] == [(0, "sync"), (1, "async"), (2, "sync")]
    losses = [e["loss"] for e in history["epochs"]]
    assert losses[0] > losses[1] > losses[2]  # each phase trains on from the last one's model
    assert sorted(os.listdir(tmp_path / "run")) == ["logs", "phase-0-sync", "phase-1-async", "phase-2-sync"]
    assert not processes_left()
