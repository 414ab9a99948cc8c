"""Async mode's remedies, against NumPy, and the combinations wrap() refuses."""
import numpy as np
import pytest

from tfsyncmodes import config
from tfsyncmodes.errors import ConfigError


def resolved(**values):
    return config.resolve(values, environ={}, use_flags=False)


def test_clip_then_staleness_and_decay_scaling_equal_numpy():
    import tensorflow as tf

    from tfsyncmodes.exchange.recipes import async_exchange
    from tfsyncmodes.exchange.version import StepVersion

    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((4, 3)).astype("float32"), rng.standard_normal(3).astype("float32")]
    knobs = resolved(mode="async", clip_norm=0.5, staleness_aware_lr=True, lr_decay=0.1)
    version = StepVersion()
    version.iterations = tf.Variable(2, dtype=tf.int64)
    version.begin_step()                  # the step reads the variables at update count 2 ...
    version.iterations.assign_add(5)      # ... and 5 updates land before it writes
    chain = async_exchange(knobs, version=version)
    out = chain.transform([tf.constant(g) for g in grads] + [None], variables=None)

    norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
    scale = min(1.0, 0.5 / norm) * (1 / (1 + 5)) * (1 / (1 + 0.1 * 7))
    for got, grad in zip(out[:2], grads):
        np.testing.assert_allclose(np.asarray(got), grad * scale, rtol=1e-5)
    assert out[2] is None
    assert int(version.staleness) == 5


def test_remedies_off_is_the_identity():
    import tensorflow as tf

    from tfsyncmodes.exchange.recipes import async_exchange

    grads = [tf.constant([3.0, -4.0])]
    out = async_exchange(resolved(mode="async", staleness_aware_lr=False)).transform(grads, variables=None)
    np.testing.assert_array_equal(np.asarray(out[0]), [3.0, -4.0])


@pytest.mark.parametrize("optimizer", ["Adam", "RMSprop"])
def test_adaptive_optimizers_are_wrapped_with_the_staleness_remedies_on_their_update(optimizer):
    """One flag is enough: Adam and its kin train in async with the staleness-aware rate on (it
    scales their update; tests/test_update_scaling.py checks the steps against NumPy)."""
    import keras

    import tfsyncmodes
    from tfsyncmodes.exchange.staleness import StalenessScaling

    scaled = resolved(mode="async", staleness_aware_lr=True)
    wrapped = tfsyncmodes.wrap(getattr(keras.optimizers, optimizer)(0.01), config=scaled)
    assert wrapped.mode == "async" and all(p.scales_update for p in wrapped.exchange.find(StalenessScaling))
    sgd = tfsyncmodes.wrap(keras.optimizers.SGD(0.01, momentum=0.9), config=scaled)
    assert not any(p.scales_update for p in sgd.exchange.find(StalenessScaling))


@pytest.mark.parametrize("legacy, wrapper", [(False, "SyncOptimizer"), (True, "SyncSGD")],
                         ids=["keras3", "tf_keras"])
@pytest.mark.timeout(120)
def test_wrap_keeps_the_knobs_in_force_when_it_wrapped(legacy, wrapper):
    # Two optimizers in one process, each wrapped with its own knobs: each exchange is built
    # from the config it was given.
    import json
    import os

    from tests.conftest import PYTHON, WORKERS, run_checked

    result = run_checked([PYTHON, os.path.join(WORKERS, "wrap_knobs.py")], timeout=100,
                         TF_USE_LEGACY_KERAS="1" if legacy else "0")
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["class"] == wrapper
    grad = np.array([3.0, -4.0])  # norm 5
    np.testing.assert_allclose(out["clipped"], -grad * 0.5 / 5.0, rtol=1e-6)
    np.testing.assert_allclose(out["plain"], -grad, rtol=1e-6)
