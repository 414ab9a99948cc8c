"""Async mode's SSP drop (--sync_max_staleness) and DC-ASGD delay compensation (--sync_delay_compensation).

* In process, the parts of :func:`~tfsyncmodes.exchange.recipes.async_exchange` against NumPy, composed with clipping and the
  two scalings in the documented order.
* Bad values: one line, exit status 2, before TensorFlow.
* On real local PS clusters (2 workers, 1 ps), Keras 3 and tf_keras, one cluster each
  (tests/workers/async_remedies.py):

  - ``schedule``: stale updates under an order the chief controls. Worker X reads the
    variables (and their version) and computes its gradient, then waits on a parameter-server
    flag while the other worker applies k real updates of its own (k is chosen per round, so
    X's staleness is exactly k); the chief raises the flag once those k steps have returned,
    and X writes. Nothing else runs meanwhile, so the weights X read, the weights it writes to
    and the order of every update are known, and NumPy replays the whole run (SGD with
    momentum, the SSP drop, DC-ASGD, 1/(1+s)) and must reach the same weights after every
    round, and the same dropped count.
  - ``fit``: the library's own training loop (Keras 3: the fit-like loop; tf_keras:
    ``model.fit``) with worker 1 slowed 4x and a bound of 0, so updates are really stale in an
    order nobody controls. Each update's staleness is recorded on its own (Keras 3: the step
    results the loop fetches; tf_keras: a histogram on the parameter server, added to with the
    variable's atomic ``scatter_add``), and each epoch's ``dropped_updates`` in the History
    must equal exactly that epoch's number of updates staler than the bound. A second count
    does not use the implementation's staleness at all: the model carries a probe scalar whose
    loss term is the probe itself (gradient exactly 1), trained by plain SGD at 2**-10 with the
    drop as the only remedy, so each applied update moves it by exactly -2**-10 and a dropped
    one by 0; the probe's change over each epoch, divided by the learning rate, is that epoch's
    applied updates (a whole number, exactly), and the steps minus those must be the History's
    ``dropped_updates``. The other weights are not replayed: each
    variable is read and written over gRPC separately, so which update's writes a concurrent
    read saw, variable by variable and against the forward pass's own reads, is not
    observable, and momentum's slot update is a read-modify-write that concurrent workers can
    interleave (the schedule has to make the stale step's whole update wait for the release
    for that reason); the controlled schedule is where the numbers are checked.
"""
import os

import numpy as np
import pytest

from tests.conftest import PYTHON, REPO, WORKERS, clean_env
from tfsyncmodes import config
from tfsyncmodes.errors import ConfigError
from tfsync_testbed import localrun

TRAIN = os.path.join(REPO, "scripts", "train.py")
REMEDIES = os.path.join(WORKERS, "async_remedies.py")


def resolved(**values):
    return config.resolve(values, environ={}, use_flags=False)


def numpy_chain(g, w_read, w_now, staleness, step, lam, clip, bound, aware, decay):
    """The documented order: compensate, clip, drop, 1/(1+s), inverse-time decay."""
    g = [gi.astype(np.float64) for gi in g]
    if lam > 0:
        g = [gi + lam * gi * gi * (n - r) for gi, r, n in zip(g, w_read, w_now)]
    if clip > 0:
        norm = np.sqrt(sum(float((gi ** 2).sum()) for gi in g))
        g = [gi * min(1.0, clip / norm) for gi in g]
    scale = 0.0 if bound != "off" and bound < staleness else 1.0
    if aware:
        scale /= 1.0 + staleness
    if decay > 0:
        scale /= 1.0 + decay * step
    return [gi * scale for gi in g]


@pytest.mark.parametrize("staleness, bound", [(5, 4), (5, 5), (0, 0), (3, "off")])
def test_parts_compose_in_order_and_equal_numpy(staleness, bound):
    import tensorflow as tf

    from tfsyncmodes.exchange.recipes import async_exchange
    from tfsyncmodes.exchange.version import StepVersion

    rng = np.random.default_rng(staleness + 10 * (0 if bound == "off" else bound + 1))
    shapes = [(4, 3), (3,)]
    g = [rng.standard_normal(s).astype("float32") for s in shapes]
    w_read = [rng.standard_normal(s).astype("float32") for s in shapes]
    w_now = [w + 0.5 * rng.standard_normal(w.shape).astype("float32") for w in w_read]
    variables = [tf.Variable(w) for w in w_read]
    knobs = resolved(mode="async", clip_norm=2.0, staleness_aware_lr=True, lr_decay=0.1,
                     max_staleness=bound, delay_compensation=0.3)
    version = StepVersion()
    version.iterations = tf.Variable(2, dtype=tf.int64)
    chain = async_exchange(knobs, version=version)
    counters = []

    def state(name, shape, dtype):
        counters.append(tf.Variable(tf.zeros(shape, dtype), name=name))
        return counters[-1]

    chain.build(variables, state)
    chain.begin_step()                              # reads version 2 and the weights w_read ...
    for variable, now in zip(variables, w_now):     # ... then other updates move the weights
        variable.assign(now)
    version.iterations.assign_add(staleness)        # ... and bump the count
    out = chain.transform([tf.constant(x) for x in g] + [None], variables + [tf.Variable(1.0)])
    expected = numpy_chain(g, w_read, w_now, staleness, 2 + staleness, 0.3, 2.0, bound, True, 0.1)
    for got, want in zip(out[:2], expected):
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-7)
    assert out[2] is None
    dropped = bound != "off" and bound < staleness
    assert (np.abs(np.asarray(out[0])).max() == 0) == dropped
    if bound != "off":
        assert int(counters[0].numpy()) == int(dropped)
        assert int(chain.step_logs()["dropped"]) == int(dropped)
    else:
        assert not counters and "dropped" not in chain.step_logs()


def test_compensation_alone_and_no_movement_is_the_identity():
    import tensorflow as tf

    from tfsyncmodes.exchange.recipes import async_exchange
    from tfsyncmodes.exchange.version import StepVersion

    knobs = resolved(mode="async", staleness_aware_lr=False, delay_compensation=0.04)
    version = StepVersion()
    version.iterations = tf.Variable(0, dtype=tf.int64)
    chain = async_exchange(knobs, version=version)
    variable = tf.Variable([1.0, -2.0])
    chain.build([variable], lambda *a: None)
    chain.begin_step()
    grads = [tf.constant([3.0, -4.0])]
    np.testing.assert_array_equal(np.asarray(chain.transform(grads, [variable])[0]), [3.0, -4.0])
    chain.after_update([variable])
    chain.begin_step()
    variable.assign([1.5, -2.0])
    np.testing.assert_allclose(np.asarray(chain.transform(grads, [variable])[0]),
                               [3.0 + 0.04 * 9.0 * 0.5, -4.0], rtol=1e-6)


def test_defaults_keep_todays_chain():
    from tfsyncmodes.exchange.remedies import DelayCompensation, StaleUpdateDrop
    from tfsyncmodes.exchange.recipes import async_exchange

    knobs = resolved(mode="async")
    assert (knobs.max_staleness, knobs.delay_compensation) == ("off", "off")
    chain = async_exchange(knobs)
    assert not chain.find(StaleUpdateDrop) and not chain.find(DelayCompensation)


@pytest.mark.parametrize("key, value, words", [
    ("max_staleness", "-2", ["-2 is out of range", "use off or an integer in [0,"]),
    ("max_staleness", "-1", ["'-1' is not accepted any more (it meant off)", "use off"]),
    ("max_staleness", "two", ["'two' is not an integer"]),
    ("delay_compensation", "-0.1", ["-0.1 is out of range", "use off or a number in (0,"]),
    ("delay_compensation", "0", ["'0' is not accepted any more (it meant off)", "use off"]),
    ("delay_compensation", "lots", ["'lots' is not a number"]),
])
def test_bad_values_name_source_field_and_fix(key, value, words):
    with pytest.raises(ConfigError) as raised:
        config.resolve(environ={f"TFSYNC_{key.upper()}": value, "TFSYNC_MODE": "async"}, use_flags=False)
    message = str(raised.value)
    assert message.startswith(f"environment: TFSYNC_{key.upper()}: "), message
    assert all(w in message for w in words), message


@pytest.mark.timeout(120)
def test_a_bad_value_on_the_command_line_is_one_line_and_exit_2():
    result = localrun.run([PYTHON, TRAIN, "--sync_mode=async", "--epochs=1", "--sync_max_staleness=-2"],
                          timeout=100, env=clean_env(), cwd=REPO)
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-3000:])
    assert "Traceback" not in result.stderr
    errors = [l for l in result.stderr.splitlines() if l.startswith("tfsyncmodes: error:")]
    assert len(errors) == 1 and "max_staleness" in errors[0] and "-2" in errors[0], result.stderr[-3000:]


# --- real PS clusters ----------------------------------------------------------------------

BOUND, LAMBDA = 1, 0.5


def replay_schedule(saved, lam=LAMBDA, bound=BOUND):
    """NumPy replay of the controlled schedule: every round, the stale step's gradient at the
    weights it read, k fresh SGD-with-momentum updates, then the stale update through the
    chain (compensated, dropped or scaled by 1/(1+k)); the weights after every round."""
    from tests import reference

    shape = tuple(saved["kernel_shape"])
    size = int(np.prod(shape))
    lr, momentum = float(saved["lr"]), float(saved["momentum"])
    w = saved["w"][0].astype(np.float64)
    velocity = np.zeros_like(w)
    x, y = saved["x"], saved["y"]

    def gradient(w, i):
        g_kernel, g_bias = reference.mse_gradients(w[:size].reshape(shape), w[size:], x[i], y[i])
        return np.concatenate([g_kernel.ravel(), g_bias])

    def update(w, velocity, g):
        velocity = momentum * velocity - lr * g
        return w + velocity, velocity

    after, index, dropped = [w.copy()], 0, 0
    for k in saved["rounds"]:
        w_read, g = w.copy(), gradient(w, index)
        index += 1
        for _ in range(k):
            w, velocity = update(w, velocity, gradient(w, index))
            index += 1
        (g,) = numpy_chain([g], [w_read], [w], int(k), 0, lam, 0.0, bound, True, 0.0)
        dropped += int(k > bound)
        w, velocity = update(w, velocity, g)
        after.append(w.copy())
    return np.stack(after), dropped


def run_cluster(tmp_path, legacy, scenarios, **env):
    from tests.test_async import Cluster

    cluster = Cluster(["--workers", "2", "--ps", "1", "--timeout", "200"],
                      [PYTHON, REMEDIES, str(tmp_path), *scenarios],
                      TF_USE_LEGACY_KERAS="1" if legacy else "0", TFSYNC_MAX_STALENESS=str(BOUND),
                      TFSYNC_DELAY_COMPENSATION=str(LAMBDA), **env)
    assert cluster.finish(220) == 0, cluster.output[-6000:]
    return cluster


@pytest.mark.slow
@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
@pytest.mark.timeout(260)
def test_ssp_drop_and_delay_compensation_on_a_real_cluster_equal_numpy(tmp_path, legacy):
    run_cluster(tmp_path, legacy, ["schedule", "fit"], TFSYNC_SLOW_WORKER="1:4")

    saved = np.load(tmp_path / "schedule.npz")
    rounds = saved["rounds"]
    # Real stale updates: the stale step is exactly k late, every fresh one on time.
    assert list(saved["stale_staleness"]) == list(rounds)
    assert not saved["fresh_staleness"].any()
    assert int(saved["iterations"]) == len(rounds) + rounds.sum()
    expected, dropped = replay_schedule(saved)
    assert int(saved["dropped"]) == dropped == int((rounds > BOUND).sum()) > 0
    np.testing.assert_allclose(saved["w"], expected, atol=2e-5)
    # Each remedy changed the run: without compensation, or without the drop, NumPy differs.
    for other in (replay_schedule(saved, lam=0.0)[0], replay_schedule(saved, bound=-1)[0]):
        assert np.abs(other[-1] - expected[-1]).max() > 1e-3

    fit = np.load(tmp_path / "fit.npz")
    counts = fit["counts"]  # [epoch, staleness] updates, recorded on their own
    assert counts.sum() == int(fit["steps"]) == int(fit["iterations"])
    stale = counts[:, int(fit["bound"]) + 1:].sum(axis=1)
    # The History's count per epoch is exactly the updates staler than the bound.
    np.testing.assert_array_equal(fit["dropped"], stale)
    assert 0 < stale.sum() < counts.sum(), counts  # updates really were stale, not all of them
    # The independent count, from the weights alone: the probe moves by exactly -lr per applied
    # update and not at all per dropped one (its values are exact in float32).
    moved = -np.diff(fit["probe"].astype(np.float64)) / float(fit["lr"])
    applied = np.rint(moved)
    np.testing.assert_array_equal(moved, applied, err_msg="the probe moved by a fraction of a step")
    np.testing.assert_array_equal(int(fit["steps_per_epoch"]) - applied, fit["dropped"],
                                  err_msg="steps minus the updates the probe saw applied != dropped_updates")
