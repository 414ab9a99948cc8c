"""Staleness remedies with an adaptive optimizer: Adam normalises a gradient's scale away, so
the staleness-aware rate (and inverse-time decay) scale Adam's *update* (its learning rate for
the step) instead. Checked step by step against a NumPy Adam whose rate is lr / (1 + staleness),
with other workers' updates landing between a step's read and its write (the shared count
moves, as on the parameter servers)."""
import numpy as np
import pytest
import tensorflow as tf

import tfsyncmodes
from tfsyncmodes.config import resolve
from tfsyncmodes.keras.compat import LEGACY, keras

pytestmark = pytest.mark.skipif(LEGACY, reason="Keras 3 in this process (tf_keras: TF_USE_LEGACY_KERAS)")

LR, B1, B2, EPS = 0.1, 0.9, 0.999, 1e-7
START = np.array([1.0, -2.0, 0.5], np.float32)
GRADS = [np.array([0.3, -0.1, 0.2], np.float32), np.array([-0.2, 0.4, 0.1], np.float32),
         np.array([0.05, 0.05, -0.3], np.float32)]


def numpy_adam(staleness, lr_decay=0.0, scaled=True):
    """Keras 3's Adam, with the step's rate scaled by 1/(1+staleness) and 1/(1+decay*count)
    (`scaled`; else the same steps, counts included, at the rate lr)."""
    w, m, v, count = START.astype(np.float64), np.zeros(3), np.zeros(3), 0
    for g, s in zip(GRADS, staleness):
        count += s  # other workers' updates landed while this step computed its gradient
        lr = LR / (1.0 + s) / (1.0 + lr_decay * count) if scaled else LR
        t = count + 1
        m += (g - m) * (1 - B1)
        v += (g * g - v) * (1 - B2)
        w -= m * (lr * np.sqrt(1 - B2 ** t) / (1 - B1 ** t)) / (np.sqrt(v) + EPS)
        count += 1
    return w


def run(inner, staleness, **knobs):
    config = resolve({"mode": "async", **knobs}, environ={}, use_flags=False)
    optimizer = tfsyncmodes.wrap(inner, config=config)
    variable = keras.Variable(START.copy())
    optimizer.build([variable])
    for g, s in zip(GRADS, staleness):
        optimizer.begin_step()
        optimizer.iterations.assign_add(s)  # updates of other workers, between read and write
        optimizer.apply([tf.constant(g)], [variable])
    return np.asarray(variable), optimizer


def test_adam_trains_in_async_with_its_update_scaled_by_staleness():
    staleness = [0, 3, 1]
    got, optimizer = run(keras.optimizers.Adam(LR), staleness)
    np.testing.assert_allclose(got, numpy_adam(staleness), rtol=1e-5, atol=1e-6)
    # The scaling is what made the difference: without it Adam's steps are not these.
    assert not np.allclose(got, numpy_adam(staleness, scaled=False), atol=1e-4)
    assert float(np.asarray(optimizer.inner_optimizer.learning_rate)) == pytest.approx(LR)  # its own rate kept


def test_inverse_time_decay_scales_adams_update_too():
    staleness = [1, 0, 2]
    got, _ = run(keras.optimizers.Adam(LR), staleness, lr_decay=0.5)
    np.testing.assert_allclose(got, numpy_adam(staleness, lr_decay=0.5), rtol=1e-5, atol=1e-6)


def test_sgd_keeps_scaling_its_gradient():
    staleness = [2, 0, 1]
    got, optimizer = run(keras.optimizers.SGD(LR), staleness)
    w = START.astype(np.float64)
    for g, s in zip(GRADS, staleness):
        w -= LR * g / (1.0 + s)
    np.testing.assert_allclose(got, w, rtol=1e-6)
    assert optimizer.exchange.update_scale() is None  # SGD: the gradient, not the update
