"""The quantizing compressors (int8, int4, int2, topk_int*) against NumPy: the codes, ranges and
values equal the reference's exactly (round half to even, mu +- k sigma clipping), every entry
inside the range comes back within scale / 2, bit packing round-trips, concatenated payloads
decompress to their sum in order, error feedback keeps exactly what was not sent, and the
payload's bytes are the wire's."""
import numpy as np
import pytest

from tests import reference, reference_compression as ref

import tensorflow as tf  # noqa: E402


def ctx(size):
    from tfsyncmodes.exchange.flat import TensorContext

    return TensorContext("flat", (size,))


def make(name, **settings):
    from tfsyncmodes.registry import COMPRESSORS

    return COMPRESSORS.get(name)(**settings)


def sample(size, seed=0):
    rng = np.random.default_rng(seed)
    flat = rng.standard_normal(size).astype(np.float32)
    flat[::97] *= 40.0  # outliers beyond 6 sigma: clipped
    return flat


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("count", [1, 7, 64, 1001])
def test_packing_round_trips_and_matches_numpy(bits, count):
    from tfsyncmodes.exchange import quantize

    codes = np.random.default_rng(count).integers(0, 2 ** bits, count).astype(np.int32)
    packed = quantize.pack(tf.constant(codes), bits)
    assert packed.dtype == tf.uint8 and packed.shape[0] == -(-count * bits // 8)
    np.testing.assert_array_equal(packed.numpy(), ref.pack(codes, bits))
    np.testing.assert_array_equal(ref.unpack(ref.pack(codes, bits), bits, count), codes)
    unpacked = quantize.unpack(tf.reshape(packed, [1, -1]), bits, count)
    np.testing.assert_array_equal(unpacked.numpy()[0], codes)


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("chunk", [0, 100])
@pytest.mark.parametrize("clip_sigma", [6.0, 1.5])
def test_codes_and_values_equal_numpy_within_half_a_step(bits, chunk, clip_sigma):
    flat = sample(1001, bits)
    compressor = make(f"int{bits}", clip_sigma=clip_sigma, chunk=chunk)
    codes, lo_scale = compressor.compress(tf.constant(flat), ctx(flat.size))
    want_codes, lo, scale = ref.quantize(flat, bits, clip_sigma, chunk)
    np.testing.assert_array_equal(lo_scale.numpy(), np.stack([lo, scale], 1).reshape(-1))
    np.testing.assert_array_equal(codes.numpy(), ref.pack(want_codes, bits))
    dense = compressor.decompress((codes, lo_scale), ctx(flat.size)).numpy()
    np.testing.assert_array_equal(dense, ref.dequantize(want_codes, lo, scale, chunk))
    width = flat.size if chunk == 0 else chunk
    step = np.repeat(scale, width)[:flat.size]
    low, high = np.repeat(lo, width)[:flat.size], np.repeat(lo + scale * (2 ** bits - 1), width)[:flat.size]
    inside = (flat >= low) & (flat <= high)
    assert inside.mean() > 0.9
    assert np.all(np.abs(dense - flat)[inside] <= step[inside] / 2 * (1 + 1e-5) + 1e-6)
    assert not inside.all() or clip_sigma == 6.0  # 1.5 sigma clips


def test_rounding_is_half_to_even_and_a_constant_tensor_is_exact():
    from tfsyncmodes.exchange import quantize

    # lo = 0, hi = 4, 2 bits: scale 4/3; choose entries at exact half steps of a scale of 1.
    flat = np.array([0.0, 0.5, 1.5, 2.5, 3.0], np.float32)  # 3 = hi, levels 3, scale 1
    codes, lo_scale = quantize.encode(tf.constant(flat), 2, 6.0, 0)
    assert lo_scale.numpy().tolist() == [0.0, 1.0]
    np.testing.assert_array_equal(quantize.unpack(tf.reshape(codes, [1, -1]), 2, 5).numpy()[0], [0, 0, 2, 2, 3])
    np.testing.assert_array_equal(ref.quantize(flat, 2)[0], [0, 0, 2, 2, 3])
    constant = np.full(10, -2.5, np.float32)
    compressor = make("int2")
    payload = compressor.compress(tf.constant(constant), ctx(10))
    np.testing.assert_array_equal(compressor.decompress(payload, ctx(10)).numpy(), constant)


@pytest.mark.parametrize("name", ["topk_int8", "topk_int4", "topk_int2"])
@pytest.mark.parametrize("implementation", ["native", "ops"])
def test_topk_quantized_keeps_indices_and_quantizes_values(name, implementation):
    flat = sample(300_000, 3)
    compressor = make(name, ratio=0.01, implementation=implementation)
    payload = compressor.compress(tf.constant(flat), ctx(flat.size))
    codes, lo_scale, low, counts = (t.numpy() for t in payload)
    _, want_indices = reference.topk_compress(flat, 0.01)
    want_low, want_counts = ref.packed_indices(np.sort(want_indices), flat.size)
    assert low.dtype == np.uint16 and counts.size == 5  # 300,000 entries: 5 blocks of 2**16
    np.testing.assert_array_equal(low, want_low)
    np.testing.assert_array_equal(counts, want_counts)
    dense = compressor.decompress(payload, ctx(flat.size)).numpy()
    want, wire = ref.quantized_roundtrip(flat, name, 0.01)
    np.testing.assert_array_equal(dense, want)
    assert codes.nbytes + lo_scale.nbytes + low.nbytes + counts.nbytes == wire
    from tfsyncmodes.exchange.compressors import payload_bytes

    assert int(payload_bytes(payload)) == wire == sum(d.size * s[0] for d, s in compressor.payload_spec(ctx(flat.size)))
    mask = np.zeros(flat.size, np.float32)
    mask[want_indices] = 1.0
    np.testing.assert_array_equal(compressor.sent_mask(payload, ctx(flat.size)).numpy(), mask)


@pytest.mark.parametrize("name,size", [("int8", 5000), ("int2", 5000), ("topk_int2", 5000), ("topk_int2", 200_000)])
def test_concatenated_payloads_decompress_to_their_sum_in_order(name, size):
    compressor = make(name, ratio=0.05) if name.startswith("topk") else make(name)
    flats = [sample(size, seed) * (seed + 1) for seed in range(3)]
    payloads = [compressor.compress(tf.constant(f), ctx(size)) for f in flats]
    joined = tuple(tf.concat([p[i] for p in payloads], 0) for i in range(len(payloads[0])))
    total = compressor.decompress(joined, ctx(size)).numpy()
    want = np.zeros(size, np.float32)
    for f in flats:
        want = (want + ref.quantized_roundtrip(f, name, 0.05)[0]).astype(np.float32)
    np.testing.assert_array_equal(total, want)


@pytest.mark.parametrize("name", ["int8", "int4", "int2", "topk_int2"])
def test_error_feedback_keeps_what_was_not_sent(name):
    from tfsyncmodes.exchange.memory import ErrorFeedback

    size = 2000
    compressor = make(name, ratio=0.02) if name.startswith("topk") else make(name)
    memory = ErrorFeedback()
    memory.build(ctx(size), lambda n, shape, dtype: tf.Variable(tf.zeros(shape, dtype)))
    residual = np.zeros(size, np.float32)
    for step in range(3):
        grad = sample(size, step)
        compensated = memory.compensate(tf.constant(grad), ctx(size))
        payload = compressor.compress(compensated, ctx(size))
        memory.update(compensated, payload, compressor, ctx(size))
        want_compensated = (grad + residual).astype(np.float32)
        np.testing.assert_array_equal(compensated.numpy(), want_compensated)
        sent, _ = ref.quantized_roundtrip(want_compensated, name, 0.02)
        residual = (want_compensated - sent).astype(np.float32)
        np.testing.assert_array_equal(memory.residual.numpy(), residual)


def test_quantizers_are_allgathered_and_their_settings_checked():
    from tfsyncmodes.exchange.communicators import CrossGroupAllgather, cross_group

    for name in ("int8", "int4", "int2", "topk_int8", "topk_int4", "topk_int2"):
        assert make(name).sparse and not make(name).lossless
        assert isinstance(cross_group(make(name), None, [0], 0), CrossGroupAllgather)
    with pytest.raises(ValueError, match="clip_sigma"):
        make("int8", clip_sigma=0.0)
    assert make("int4").payload_spec(ctx(1001)) == [(tf.uint8, [501]), (tf.float32, [2])]
