"""Deep Gradient Compression's corrections against NumPy: momentum correction with momentum
factor masking and without it (u and v, step by step, with Top-K and with a quantizing Top-K;
without masking at full density, momentum SGD), the exponential
sparsity warm-up (the ratio of every step, and the payload's length following it), local
clipping to clip_norm / sqrt(N), the warning for an inner optimizer with momentum of its own,
and the knobs that turn them on (and are flagged when they have no effect)."""
import logging

import numpy as np
import pytest

from tests import reference, reference_compression as ref

import tensorflow as tf  # noqa: E402


def ctx(size):
    from tfsyncmodes.exchange.flat import TensorContext

    return TensorContext("flat", (size,))


def state(name, shape, dtype):
    return tf.Variable(tf.zeros(shape, dtype), name=name)


@pytest.mark.parametrize("name", ["topk", "topk_int2"])
@pytest.mark.parametrize("implementation", ["native", "ops"])
@pytest.mark.parametrize("masking", [True, False])
def test_momentum_correction_accumulates_and_masks_as_numpy(name, implementation, masking):
    from tfsyncmodes.exchange.dgc import MomentumCorrection
    from tfsyncmodes.registry import COMPRESSORS

    size, ratio, m = 3000, 0.02, 0.9
    compressor = COMPRESSORS.get(name)(ratio=ratio, implementation=implementation)
    memory = MomentumCorrection(momentum=m, masking=masking)
    memory.build(ctx(size), state)
    u = np.zeros(size, np.float32)
    v = np.zeros(size, np.float32)
    rng = np.random.default_rng(1)
    for _ in range(4):
        g = rng.standard_normal(size).astype(np.float32)
        compensated = memory.compensate(tf.constant(g), ctx(size))
        payload = compressor.compress(compensated, ctx(size))
        memory.update(compensated, payload, compressor, ctx(size))
        u = (np.float32(m) * u + g).astype(np.float32)
        v = (v + u).astype(np.float32)
        np.testing.assert_array_equal(compensated.numpy(), v)
        _, indices = reference.topk_compress(v, ratio)
        sent = (reference.topk_decompress(*reference.topk_compress(v, ratio), size) if name == "topk"
                else ref.quantized_roundtrip(v, name, ratio)[0])
        v = (v - sent).astype(np.float32)
        if masking:
            u[indices] = 0.0
        np.testing.assert_array_equal(memory.accumulated.numpy(), v)
        np.testing.assert_array_equal(memory.velocity.numpy(), u)
        if name == "topk":  # momentum factor masking: v too is 0 where sent
            assert np.all(v[indices] == 0)


def test_without_masking_full_density_is_sgd_with_momentum():
    """Every entry sent and u kept: the sent update is heavy-ball momentum's, u = m u + g, as a
    NumPy momentum SGD gives it (with masking it would be the plain gradient)."""
    from tfsyncmodes.exchange.dgc import MomentumCorrection
    from tfsyncmodes.registry import COMPRESSORS

    size, m = 500, 0.9
    compressor = COMPRESSORS.get("topk")(ratio=1.0)
    rng = np.random.default_rng(3)
    grads = rng.standard_normal((5, size)).astype(np.float32)
    for masking in (False, True):
        memory = MomentumCorrection(momentum=m, masking=masking)
        memory.build(ctx(size), state)
        momentum = np.zeros(size, np.float32)
        for g in grads:
            compensated = memory.compensate(tf.constant(g), ctx(size))
            payload = compressor.compress(compensated, ctx(size))
            memory.update(compensated, payload, compressor, ctx(size))
            momentum = (np.float32(m) * momentum + g).astype(np.float32)
            sent = compressor.decompress(payload, ctx(size)).numpy()
            np.testing.assert_allclose(sent, momentum if not masking else g, rtol=1e-6, atol=1e-6)


def test_sparsity_warmup_follows_the_exponential_schedule():
    from tfsyncmodes.exchange.compressors import TopK
    from tfsyncmodes.exchange.warmup import SparsityWarmup, warmup_densities

    assert warmup_densities(0.01) == [0.25, 0.0625, 0.015625]
    assert warmup_densities(0.001) == [0.25, 0.0625, 0.015625, 0.00390625]
    size, ratio, steps = 10_000, 0.01, 7
    warmup = SparsityWarmup(steps)
    topk = TopK(ratio=ratio, warmup=warmup)
    warmup.build([], state)
    compress = tf.function(topk.compress)
    flat = tf.constant(np.random.default_rng(0).standard_normal(size).astype(np.float32))
    seen = []
    for step in range(10):
        values, indices = compress(flat, ctx(size))
        want = ref.warmup_ratio(step, ratio, steps)
        assert indices.shape[0] == topk.k(size, want), step
        _, want_indices = reference.topk_compress(flat.numpy(), want)
        assert sorted(indices.numpy().tolist()) == sorted(want_indices.tolist())
        seen.append(want)
        warmup.after_update([])
    assert seen == [0.25, 0.25, 0.25, 0.0625, 0.0625, 0.015625, 0.015625, 0.01, 0.01, 0.01]
    assert SparsityWarmup(0).ratios(0.01) == [0.01]


@pytest.mark.parametrize("ranks, norm", [(2, 0.5), (4, 100.0)])
def test_local_clipping_scales_the_norm_by_one_over_sqrt_ranks(ranks, norm):
    from tfsyncmodes.exchange.dgc import local_clip

    grads = [tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3)), None, tf.constant([3.0, -4.0])]
    clipped = local_clip(norm, ranks).transform(grads, [None] * 3)
    assert clipped[1] is None
    flat = np.concatenate([np.arange(6, dtype=np.float32), [3.0, -4.0]]).astype(np.float32)
    want = ref.clip_global(flat, norm / np.sqrt(ranks))
    got = np.concatenate([clipped[0].numpy().reshape(-1), clipped[2].numpy()])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_an_inner_optimizer_with_momentum_of_its_own_is_warned_about(caplog):
    from tfsyncmodes.exchange.dgc import MomentumCorrection
    from tfsyncmodes.keras.compat import keras

    caplog.set_level(logging.WARNING)
    MomentumCorrection().attach(keras.optimizers.SGD(0.1))
    assert not caplog.records
    MomentumCorrection().attach(keras.optimizers.SGD(0.1, momentum=0.9))
    MomentumCorrection().attach(keras.optimizers.Adam(0.1))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "adds momentum 0.9 again" in lines[0] and "Adam rescales" in lines[1]


def test_dgc_knobs_turn_the_parts_on_and_are_flagged_without_top_k():
    import tfsyncmodes
    from tfsyncmodes import knobs
    from tfsyncmodes.exchange import knob_settings

    on = tfsyncmodes.resolve({"mode": "sync", "compression": "topk_int2", "dgc": True, "dgc_clip_norm": 2.0,
                              "dgc_warmup_steps": 40}, environ={}, use_flags=False)
    assert knob_settings.dgc_on(on) and knob_settings.dgc_momentum(on) == 0.9 and knob_settings.dgc_masking(on)
    unmasked = tfsyncmodes.resolve({"mode": "sync", "compression": "topk", "dgc": True, "dgc_masking": False},
                                   environ={}, use_flags=False)
    assert not knob_settings.dgc_masking(unmasked)
    assert knob_settings.dgc_clip(on, 4).clip_norm == pytest.approx(1.0)
    assert knob_settings.sparsity_warmup(on).steps == 40
    chosen = knob_settings.compressor(on, knob_settings.sparsity_warmup(on))
    assert chosen.bits == 2 and chosen.warmup is not None and chosen.values.clip_sigma == 6.0
    for key in ("dgc_momentum", "dgc_masking", "dgc_clip_norm", "dgc_warmup_steps", "topk_ratio", "quantize_sigma"):
        assert knobs.in_force(knobs.KNOBS_BY_KEY[key], on.as_dict() if hasattr(on, "as_dict") else vars(on)), key
    assert not knobs.in_force(knobs.KNOBS_BY_KEY["error_feedback"], vars(on))  # DGC's memory replaces it
    dense = tfsyncmodes.resolve({"mode": "sync", "compression": "int8", "dgc": True}, environ={}, use_flags=False)
    assert not knob_settings.dgc_on(dense)
    for key in ("dgc", "dgc_momentum", "dgc_masking", "topk_ratio"):
        assert not knobs.in_force(knobs.KNOBS_BY_KEY[key], vars(dense)), key
    assert knobs.in_force(knobs.KNOBS_BY_KEY["quantize_sigma"], vars(dense))
