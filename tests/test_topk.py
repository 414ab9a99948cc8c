"""Top-K selection and decompression, both implementations (compiled kernels and TensorFlow
ops), against NumPy: every branch of the selection (all entries as candidates, the sampled
threshold, its wider retry, the full fallback), ties, all-zero input, k close to n, sums of
concatenated payloads, and error feedback keeping exactly what was not sent."""
import numpy as np
import pytest

from tests import reference

import tensorflow as tf  # noqa: E402  (a broken TensorFlow must fail these tests, not skip them)

IMPLEMENTATIONS = ["native", "ops"]


def compressor(implementation, ratio):
    from tfsyncmodes.exchange.compressors import TopK

    return TopK(ratio=ratio, implementation=implementation)


def ctx(size):
    from tfsyncmodes.exchange.flat import TensorContext

    return TensorContext("flat", (size,))


def check_exact(implementation, flat, ratio, graph=False):
    """The payload is the stable-sort Top-K of `flat` and decompresses to NumPy's scatter."""
    topk = compressor(implementation, ratio)
    assert topk.implementation == implementation
    size = flat.size
    compress = tf.function(topk.compress) if graph else topk.compress
    values, indices = compress(tf.constant(flat), ctx(size))
    want_values, want_indices = reference.topk_compress(flat, ratio)
    got = indices.numpy()
    assert indices.dtype == tf.int32 and values.dtype == tf.float32
    assert len(got) == len(want_indices) == topk.k(size)
    assert sorted(got.tolist()) == sorted(want_indices.tolist())
    np.testing.assert_array_equal(values.numpy(), flat[got])
    dense = topk.decompress((values, indices), ctx(size)).numpy()
    np.testing.assert_array_equal(dense, reference.topk_decompress(want_values, want_indices, size))
    return got


def native_sample_positions(size, sample_size=8192, run=64):
    """Where the compiled selection samples its threshold (runs of 64 evenly spaced)."""
    runs = sample_size // run
    gap = size // runs
    return np.concatenate([np.arange(r * gap, min(size, r * gap + run)) for r in range(runs)])


def ops_sample_positions(size, sample_size=20000):
    return np.arange(0, size, size // sample_size)


SAMPLES = {"native": native_sample_positions, "ops": ops_sample_positions}


def test_the_compiled_kernels_are_built_and_auto_takes_them():
    from tfsyncmodes.exchange.topk import TopKSelection

    assert TopKSelection("auto").implementation == "native"  # scripts/install.sh built them
    with pytest.raises(ValueError, match="use one of auto, native, ops"):
        TopKSelection("fast")


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("size, ratio", [
    (18, 0.25),            # tiny: every entry is a candidate
    (1000, 0.01),
    (30_000, 0.01),        # below either sampling size: every entry is a candidate
    (60_000, 0.01),        # sampled in native, every entry a candidate in ops
    (300_000, 0.01),       # the sampled threshold
    (300_000, 0.001),
    (300_000, 0.2),        # 8 k > n: every entry is a candidate
    (1000, 0.999),         # k = n - 1
    (300_000, 1.0),        # k = n
])
def test_selection_is_the_exact_top_k(implementation, size, ratio):
    flat = np.random.default_rng(size).standard_normal(size).astype(np.float32)
    got = check_exact(implementation, flat, ratio)
    if implementation == "native":  # indices come out in increasing order
        assert np.all(np.diff(got) > 0)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_misleading_sample_retries_wider_then_falls_back_exactly(implementation):
    size, ratio = 300_000, 0.01
    rng = np.random.default_rng(5)
    sampled = SAMPLES[implementation](size)
    # 150 huge sampled entries: the first threshold keeps fewer than k entries, the 4x wider
    # one lands among the ordinary entries and keeps enough.
    retry = rng.standard_normal(size).astype(np.float32)
    retry[sampled[:150]] = 1000.0
    check_exact(implementation, retry, ratio)
    # Every sampled entry huge: both thresholds keep only sampled entries (fewer than k), so
    # the selection runs over all entries.
    full = rng.standard_normal(size).astype(np.float32)
    full[sampled] += 100.0
    check_exact(implementation, full, ratio, graph=True)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_ties_go_to_the_lower_index_and_all_zero_input_gives_the_first_k(implementation):
    size = 300_000
    # Magnitudes 0, 1, 2 with both signs: many ties at the boundary, -2 ties with 2.
    ties = np.random.default_rng(7).integers(-2, 3, size).astype(np.float32)
    check_exact(implementation, ties, 0.01)
    check_exact(implementation, ties[:1000], 0.3)
    zeros = check_exact(implementation, np.zeros(size, np.float32), 0.01)
    assert sorted(zeros.tolist()) == list(range(3000))
    signed_zeros = np.zeros(1000, np.float32)
    signed_zeros[::2] = -0.0
    assert sorted(check_exact(implementation, signed_zeros, 0.1).tolist()) == list(range(100))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_concatenated_payloads_decompress_to_their_sum(implementation):
    rng = np.random.default_rng(3)
    size = 100_000
    topk = compressor(implementation, 0.05)
    parts = [rng.standard_normal(size).astype(np.float32) for _ in range(3)]
    payloads = [topk.compress(tf.constant(p), ctx(size)) for p in parts]
    concatenated = tuple(tf.concat([p[i] for p in payloads], 0) for i in range(2))
    want = np.zeros(size, np.float64)
    for p in parts:
        values, indices = reference.topk_compress(p, 0.05)
        np.add.at(want, indices, values.astype(np.float64))
    np.testing.assert_allclose(topk.decompress(concatenated, ctx(size)).numpy(), want, rtol=0, atol=1e-6)


def test_native_decompression_refuses_an_index_outside_the_update():
    topk = compressor("native", 0.1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="index 10 is outside"):
        topk.decompress((tf.constant([1.0, 2.0]), tf.constant([3, 10], tf.int32)), ctx(10))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_error_feedback_keeps_exactly_what_was_not_sent(implementation):
    from tfsyncmodes.exchange.memory import ErrorFeedback

    size, ratio = 300_000, 0.01
    topk, memory, flat = compressor(implementation, ratio), ErrorFeedback(), ctx(size)
    memory.build(flat, lambda name, shape, dtype: tf.Variable(tf.zeros(shape, dtype)))
    rng = np.random.default_rng(11)
    kept = np.zeros(size, np.float32)
    for _ in range(3):
        update = rng.standard_normal(size).astype(np.float32)
        compensated = update + kept
        payload = topk.compress(memory.compensate(tf.constant(update), flat), flat)
        memory.update(tf.constant(compensated), payload, topk, flat)
        values, indices = reference.topk_compress(compensated, ratio)
        want = compensated.copy()
        want[indices] = 0.0  # sent entries leave nothing behind, every other one stays whole
        kept = memory.residual.numpy()
        np.testing.assert_array_equal(kept, want)
        np.testing.assert_array_equal(kept + reference.topk_decompress(values, indices, size), compensated)
