"""Switching between sync and hybrid within one horovodrun job (``--sync_mode_schedule``): the
steps just before and after every switch against NumPy, one model and one optimizer state on
every rank after a switch to sync, the logs and markers of each switch, and bad schedules."""
import json
import os
import numpy as np
import pytest

from tests import reference, reference_switch
from tests.conftest import PYTHON, WORKERS, run_checked
from tfsyncmodes import schedule as schedule_lib
from tfsyncmodes.exchange import recipes
from tfsyncmodes.switching.callback import mode_code
from tfsyncmodes.config import resolve
from tfsync_testbed import localrun

EPOCHS, STEPS = 3, 4  # 12 steps; every epoch feeds the same 4 batches


# --- in this process -------------------------------------------------------------------------

def test_a_schedule_is_a_switch_plan_with_one_config_per_mode(monkeypatch):
    import dataclasses

    from tfsyncmodes import knobs

    config = resolve({"mode_schedule": "sync:10%,hybrid:80%,sync"}, environ={"TFSYNC_TOPK_RATIO": "0.5"},
                     use_flags=False)
    plan, modes = recipes.switch_plan(config)
    assert modes == ("sync", "hybrid") and type(plan).__name__ == "SchedulePlan"
    # Knobs left at their default take each mode's default; knobs given stay as given. (No
    # shipped knob's default differs by mode now: one that did is declared here.)
    staleness = dataclasses.replace(knobs.KNOBS_BY_KEY["staleness"], default=2, mode_defaults=(("hybrid", 7),))
    from tfsyncmodes import config as config_lib

    patched = tuple(staleness if k.key == "staleness" else k for k in knobs.KNOBS)
    monkeypatch.setattr(knobs, "KNOBS", patched)
    monkeypatch.setattr(config_lib, "KNOBS", patched)
    hybrid, sync = recipes.mode_config(config, "hybrid"), recipes.mode_config(config, "sync")
    assert (hybrid.mode, hybrid.staleness, hybrid.topk_ratio) == ("hybrid", staleness.default_for("hybrid"), 0.5)
    assert (sync.mode, sync.staleness, sync.topk_ratio) == ("sync", staleness.default, 0.5)
    assert recipes.switch_plan(resolve({}, environ={}, use_flags=False)) is None
    assert [mode_code(m) for m in ("sync", "async", "hybrid")] == [0, 1, 2]


@pytest.mark.parametrize("text, words", [
    ("sync:1e,async", "run it with python -m tfsyncmodes.launch"),
    ("hybrid:50%,sync", "needs horovodrun"),
])
def test_schedules_this_process_cannot_run_are_one_clear_error(text, words):
    import tfsyncmodes
    from tfsyncmodes.errors import ConfigError

    config = resolve({"mode_schedule": text}, environ={}, use_flags=False)
    with pytest.raises(ConfigError) as error:
        tfsyncmodes.make_strategy(config=config)
    assert words in str(error.value) and "mode_schedule" in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("policy", ["straggler", "auto"])
def test_a_switch_policy_outside_horovodrun_names_its_own_knob(policy):
    import tfsyncmodes
    from tfsyncmodes.errors import ConfigError

    config = resolve({"switch_policy": policy}, environ={}, use_flags=False)
    with pytest.raises(ConfigError) as error:
        tfsyncmodes.make_strategy(config=config)
    text = str(error.value)
    assert "needs horovodrun" in text and f"--sync_switch_policy={policy}" in text and "mode_schedule" not in text, text


def test_a_switching_optimizer_round_trips_through_model_save(tmp_path):
    """Every mode's exchange state is optimizer state and comes back from ``model.save``, with
    the knobs the run was given (here hybrid's Top-K error feedback)."""
    import keras

    import tfsyncmodes
    from tfsyncmodes.exchange.switchable import SwitchableExchange

    config = resolve({"mode_schedule": "sync:1,hybrid", "compression": "topk"}, environ={}, use_flags=False)
    model = keras.Sequential([keras.Input((reference.FEATURES,)), keras.layers.Dense(reference.OUTPUTS)])
    model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.Adam(), config=config), loss="mse")
    x, y = reference.linear_data(2, 1)
    model.fit(x.reshape(-1, reference.FEATURES), y.reshape(-1, reference.OUTPUTS), batch_size=reference.BATCH,
              verbose=0)
    exchange = model.optimizer.exchange
    assert isinstance(exchange, SwitchableExchange) and exchange.modes == ("sync", "hybrid")
    names = [v.path.split("/")[-1] for v in exchange.state_variables("hybrid")]
    assert "error_feedback_residual" in names and "local_sgd_anchor" in names
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer.exchange, SwitchableExchange)
    saved, back = model.optimizer.variables, loaded.optimizer.variables
    assert len(saved) == len(back)
    for a, b in zip(saved, back):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


def test_a_resumed_run_reenters_its_phase_without_resetting_it():
    """A run whose step count is already in a hybrid phase (a resumed run) trains in hybrid
    from its first step, keeps the phase's state, and records no switch; later boundaries
    switch as usual. (One process: the exchanges change nothing here; this is the driver.)"""
    import keras

    import tfsyncmodes
    from tfsyncmodes.switching.callback import ScheduleSwitch

    config = resolve({"mode_schedule": "sync:2,hybrid:4,sync"}, environ={}, use_flags=False)
    model = keras.Sequential([keras.Input((reference.FEATURES,)), keras.layers.Dense(reference.OUTPUTS)])
    model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.SGD(reference.LR), config=config), loss="mse")
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)
    optimizer.iterations.assign(3)  # as restored from a backup taken after step 2
    step_var = next(v for v in optimizer.exchange.state_variables("hybrid") if v.path.endswith("local_sgd_step"))
    step_var.assign(7)  # the phase's own state, restored with it
    modes = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: modes.append(logs["mode"]))
    switch = ScheduleSwitch("sync:2,hybrid:4,sync")
    x, y = reference.linear_data(4, 1)
    model.fit(x.reshape(-1, reference.FEATURES), y.reshape(-1, reference.OUTPUTS), batch_size=reference.BATCH,
              epochs=2, steps_per_epoch=4, verbose=0, callbacks=[switch, record])
    assert switch.phases[1] == schedule_lib.Phase("hybrid", 2, 6)
    # Steps 3, 4, 5 in hybrid (entered, not switched to: its state was kept), then sync.
    assert modes[:3] == [2.0, 2.0, 2.0] and set(modes[3:]) == {0.0}
    assert switch.switches == [(6, "hybrid", "sync")]
    assert int(step_var.numpy()) == 7  # one process: the policy is inactive and does not count


# --- horovodrun -np 4, two groups of two ------------------------------------------------------

def _flat(params):
    return np.concatenate([np.asarray(p, np.float64).reshape(-1) for p in params])


def _split(flat):
    k = reference.FEATURES * reference.OUTPUTS
    return flat[:k].reshape(reference.FEATURES, reference.OUTPUTS), flat[k:]


def expected_steps(initial, phases, groups, knobs, rounds=None):
    """Each rank's weights at the start (after the switch callbacks) and at the end of every
    step: sync phases take the mean gradient of all ranks; a hybrid phase is a fresh hybrid run
    from the phase's first weights (group means, cross-group policy) that ends with the mean of
    the groups' models. `rounds[g][t]`: background rounds group g applied after step t."""
    x, y = reference.linear_data(STEPS, 4)
    total = phases[-1].end
    xs, ys = np.concatenate([x] * EPOCHS)[:total], np.concatenate([y] * EPOCHS)[:total]
    of_rank = [next(g for g, ranks in enumerate(groups) if r in ranks) for r in range(4)]
    begin, end = np.zeros((total, 4, initial.size)), np.zeros((total, 4, initial.size))
    start, hybrid_steps = np.asarray(initial, np.float64), 0
    for phase in phases:
        for t in range(phase.start, phase.end):
            px, py = xs[phase.start:t + 1], ys[phase.start:t + 1]
            if phase.mode == "sync":
                after = [_flat(reference.mean_gradient_training(*_split(start), px, py))] * 4
            else:
                schedule = None if rounds is None else [
                    [c - hybrid_steps for c in rounds[g][phase.start:t + 1]] for g in range(len(groups))]
                per_group = reference.hybrid_training(*_split(start), px, py, groups, consensus=False,
                                                      schedule=schedule, **knobs)
                after = [_flat(per_group[of_rank[r]]) for r in range(4)]
            begin[t] = end[t - 1] if t > phase.start else start
            end[t] = after
        if phase.mode == "hybrid":  # leaving hybrid (or the end of training): the groups' mean
            hybrid_steps += phase.steps
            start = np.mean(end[phase.end - 1], axis=0)
        else:
            start = end[phase.end - 1][0]
    return begin, end, start


def run_job(tmp_path, optimizers, **env):
    command = localrun.horovodrun_command(4, [PYTHON, os.path.join(WORKERS, "switch_steps.py"), str(tmp_path),
                                              f"--optimizers={optimizers}", f"--epochs={EPOCHS}",
                                              f"--steps={STEPS}"])
    result = run_checked(command, timeout=400, TFSYNC_GROUP_SIZE=env.pop("TFSYNC_GROUP_SIZE", 2), **env)
    return result, {name: [np.load(tmp_path / f"{name}.rank{r}.npz") for r in range(4)]
                    for name in optimizers.split(",")}


def check_switches(workers, text, knobs, optimizer_class, rounds=None, tolerance=1e-5):
    phases = schedule_lib.phases(text, EPOCHS * STEPS, STEPS)
    groups = [list(g) for g in workers[0]["groups"]]
    begin, end, final = expected_steps(workers[0]["initial"], phases, groups, knobs, rounds)
    for rank, w in enumerate(workers):
        assert str(w["optimizer_class"]) == optimizer_class
        assert int(w["iterations"]) == EPOCHS * STEPS
        for phase in phases:  # the steps just before and just after each switch, and the ends
            for t in {phase.start, phase.start + 1, phase.end - 2, phase.end - 1} & set(range(phase.start, phase.end)):
                np.testing.assert_allclose(w["begin"][t], begin[t][rank], rtol=0, atol=tolerance,
                                           err_msg=f"rank {rank} start of step {t} ({phase.mode})")
                np.testing.assert_allclose(w["end"][t], end[t][rank], rtol=0, atol=tolerance,
                                           err_msg=f"rank {rank} end of step {t} ({phase.mode})")
        np.testing.assert_allclose(w["final"], final, rtol=0, atol=tolerance)
        # The mode in every step's logs, and in History per epoch (at the epoch's end).
        assert list(w["modes"]) == [mode_code(schedule_lib.mode_at(phases, t))
                                    for t in range(EPOCHS * STEPS)]
        history = json.loads(str(w["history"]))
        assert history["mode"] == [mode_code(schedule_lib.mode_at(phases, (e + 1) * STEPS - 1))
                                   for e in range(EPOCHS)]
        boundaries = [p.start for p in phases[1:]]
        assert history["mode_switches"] == [sum(e * STEPS <= b < (e + 1) * STEPS for b in boundaries)
                                            for e in range(EPOCHS)]
        assert json.loads(str(w["switches"])) == [[b.start, a.mode, b.mode] for a, b in zip(phases, phases[1:])]
    # Groups really drifted apart in each hybrid phase (so the mean at its end mattered).
    hybrid = [p for p in phases if p.mode == "hybrid"]
    assert all(np.abs(end[p.end - 1][groups[0][0]] - end[p.end - 1][groups[1][0]]).max() > 1e-4 for p in hybrid)
    # After every switch to sync, every rank holds the same bits, through the sync phase.
    for phase in phases:
        if phase.mode == "sync" and phase.start > 0:
            for t in range(phase.start, phase.end):
                for w in workers[1:]:
                    np.testing.assert_array_equal(w["begin"][t], workers[0]["begin"][t])
                    np.testing.assert_array_equal(w["end"][t], workers[0]["end"][t])
    # The chief's TensorBoard marker at each switch step.
    markers = json.loads(str(workers[0]["markers"]))
    assert [m[0] for m in markers[1:]] == [p.start for p in phases[1:]]
    assert all(f"{a.mode} -> {b.mode} at step {b.start}" in m[1] for (a, b), m in zip(zip(phases, phases[1:]), markers[1:]))


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_keras3_sync_hybrid_sync_periodic_equal_numpy_and_one_state_after(tmp_path):
    text = "sync:3,hybrid:6,sync"
    knobs = {"compression": "none", "period": 4, "cross_group": "periodic"}  # hybrid's defaults
    result, runs = run_job(tmp_path, "sgd,adam", TFSYNC_MODE_SCHEDULE=text, TFSYNC_PERIOD=4)
    check_switches(runs["sgd"], text, knobs, "SyncOptimizer")
    # bytes_sent per epoch: each rank's slice of the dense float32 model change of each average
    # (2 groups of 2: half of its 18 entries, rank j of a group the j-th half) over the epoch's
    # hybrid steps (0 in sync steps and epochs), one History entry per epoch.
    phases, period = schedule_lib.phases(text, EPOCHS * STEPS, STEPS), knobs["period"]
    size = (reference.FEATURES * reference.OUTPUTS + reference.OUTPUTS) / 2
    assert size == 9
    hybrid = [p for p in phases if p.mode == "hybrid"][0]
    want = []
    for e in range(EPOCHS):
        steps = [t for t in range(e * STEPS, (e + 1) * STEPS) if hybrid.start <= t < hybrid.end]
        averages = sum((t - hybrid.start + 1) % period == 0 for t in steps)
        want.append(4.0 * size * averages / len(steps) if steps else 0.0)
    for w in runs["sgd"]:
        assert json.loads(str(w["history"]))["bytes_sent"] == pytest.approx(want)
    # Adam: groups' moments differ after hybrid; the switch averages them with the weights, so
    # sync keeps every rank on the same bits.
    adam = runs["adam"]
    for t in range(9, EPOCHS * STEPS):
        for w in adam[1:]:
            np.testing.assert_array_equal(w["end"][t], adam[0]["end"][t])
    assert np.abs(adam[0]["end"][8] - adam[2]["end"][8]).max() > 1e-4
    # ... and every step equals NumPy's Adam whose moments are averaged on leaving hybrid (rank
    # 0's moments kept instead would be another model from step 9 on).
    x, y = reference.linear_data(STEPS, 4)
    want = reference_switch.adam_through_phases(
        *_split(adam[0]["initial"]), np.concatenate([x] * EPOCHS), np.concatenate([y] * EPOCHS),
        [(p.mode, p.start, p.end) for p in phases], [list(g) for g in adam[0]["groups"]], period)
    for rank, w in enumerate(adam):
        np.testing.assert_allclose(w["end"], want[:, rank], rtol=0, atol=1e-5, err_msg=f"Adam, rank {rank}")
    # One log line per switch, on the chief only.
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "switched" in line]
    assert len(lines) == 4 and all(line.startswith("[0]") for line in lines), lines


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_tf_keras_hybrid_sync_hybrid_stale_background_reentered_clean_equal_numpy(tmp_path):
    text = "hybrid:3,sync:2,hybrid:5,sync"
    knobs = {"compression": "none", "staleness": 1, "cross_group": "stale"}
    _, runs = run_job(tmp_path, "sgd", TFSYNC_MODE_SCHEDULE=text, TFSYNC_STALENESS=1,
                      TFSYNC_CROSS_GROUP="stale", TFSYNC_GROUPS="0,2;1,3", TF_USE_LEGACY_KERAS=1)
    workers = runs["sgd"]
    phases = schedule_lib.phases(text, EPOCHS * STEPS, STEPS)
    groups = [list(g) for g in workers[0]["groups"]]
    assert groups == [[0, 2], [1, 3]]
    # Rounds applied after each step, per group (its ranks agree), within the staleness bound;
    # each hybrid phase starts with none pending (sent == applied when it is entered).
    rounds, sent = [], 0
    for ranks in groups:
        counts = [list(workers[r]["applied"]) for r in ranks]
        assert counts[0] == counts[1]
        rounds.append(counts[0])
    for phase in phases:
        if phase.mode == "hybrid":
            for t in range(phase.start, phase.end):
                sent += 1
                assert all(sent - 1 <= r[t] <= sent for r in rounds), (rounds, t)
    check_switches(workers, text, knobs, "SyncSGD", rounds=rounds)
