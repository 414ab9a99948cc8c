"""The quantizing compressors (int8, int4, int2, topk_int*) against NumPy, with both
implementations (the compiled kernels and TensorFlow ops): the codes, ranges and values equal
the reference's exactly (round half to even, mu +- k sigma clipping), every entry inside the
range comes back within scale / 2, bit packing round-trips, concatenated payloads decompress to
their sum in order, error feedback keeps exactly what was not sent, and the payload's bytes are
the wire's. The kernels also on a 1.1M-entry tensor (blocks split over threads, chunks across
blocks), with one CPU thread and SSE2 and with two and AVX2 where the CPU has it, and their
checks of malformed payloads."""
import os
import subprocess
import sys

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


IMPLEMENTATIONS = ["native", "ops"]


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("chunk", [0, 100])
@pytest.mark.parametrize("clip_sigma", [6.0, 1.5])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_codes_and_values_equal_numpy_within_half_a_step(bits, chunk, clip_sigma, implementation):
    flat = sample(1001, bits)
    compressor = make(f"int{bits}", clip_sigma=clip_sigma, chunk=chunk, implementation=implementation)
    assert compressor.implementation == implementation
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


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_rounding_is_half_to_even_and_a_constant_tensor_is_exact(implementation):
    from tfsyncmodes.exchange import quantize

    # lo = 0, hi = 4, 2 bits: scale 4/3; choose entries at exact half steps of a scale of 1.
    flat = np.array([0.0, 0.5, 1.5, 2.5, 3.0], np.float32)  # 3 = hi, levels 3, scale 1
    codes, lo_scale = quantize.Quantizer(implementation).encode(tf.constant(flat), 2, 6.0, 0)
    assert lo_scale.numpy().tolist() == [0.0, 1.0]
    np.testing.assert_array_equal(quantize.unpack(tf.reshape(codes, [1, -1]), 2, 5).numpy()[0], [0, 0, 2, 2, 3])
    np.testing.assert_array_equal(ref.quantize(flat, 2)[0], [0, 0, 2, 2, 3])
    constant = np.full(10, -2.5, np.float32)
    compressor = make("int2", implementation=implementation)
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
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_concatenated_payloads_decompress_to_their_sum_in_order(name, size, implementation):
    extra = {"ratio": 0.05} if name.startswith("topk") else {}
    compressor = make(name, implementation=implementation, **extra)
    flats = [sample(size, seed) * (seed + 1) for seed in range(3)]
    payloads = [compressor.compress(tf.constant(f), ctx(size)) for f in flats]
    joined = tuple(tf.concat([p[i] for p in payloads], 0) for i in range(len(payloads[0])))
    total = compressor.decompress(joined, ctx(size)).numpy()
    want = np.zeros(size, np.float32)
    for f in flats:
        want = (want + ref.quantized_roundtrip(f, name, 0.05)[0]).astype(np.float32)
    np.testing.assert_array_equal(total, want)


@pytest.mark.parametrize("name", ["int8", "int4", "int2", "topk_int2"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_error_feedback_keeps_what_was_not_sent(name, implementation):
    from tfsyncmodes.exchange.memory import ErrorFeedback

    size = 2000
    extra = {"ratio": 0.02} if name.startswith("topk") else {}
    compressor = make(name, implementation=implementation, **extra)
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


LARGE = 1_126_410  # the 1.1M-parameter MLP's update: 69 blocks of the kernels' 16,384 entries

# Run in a process of its own with one CPU thread and the SSE2 passes (TFSYNC_KERNELS_SSE2): the
# kernels' blocks then run one after another, four entries to a register on any x86-64 CPU.
ONE_THREAD = """
import sys, numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
from tfsyncmodes.exchange import quantize
flat = np.load(sys.argv[1])
quantizer = quantize.Quantizer("native")
out = {}
for bits, chunk in [(8, 0), (4, 20000), (2, 100)]:
    codes, lo_scale = quantizer.encode(tf.constant(flat), bits, 6.0, chunk)
    out[f"codes{bits}"], out[f"lo_scale{bits}"] = codes.numpy(), lo_scale.numpy()
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("bits,chunk", [(8, 0), (4, 20000), (2, 100)])
def test_the_kernels_equal_numpy_on_a_large_tensor_with_one_thread_or_two_and_sse2_or_avx2(bits, chunk, tmp_path):
    from tfsyncmodes.exchange import quantize

    rng = np.random.default_rng(bits)
    flat = (rng.standard_normal(LARGE) * 0.01 + 0.003).astype(np.float32)
    flat[::1013] *= 50.0
    quantizer = quantize.Quantizer("native")
    codes, lo_scale = quantizer.encode(tf.constant(flat), bits, 6.0, chunk)
    want_codes, lo, scale = ref.quantize(flat, bits, 6.0, chunk)
    np.testing.assert_array_equal(lo_scale.numpy(), np.stack([lo, scale], 1).reshape(-1))
    np.testing.assert_array_equal(codes.numpy(), ref.pack(want_codes, bits))

    # Four ranks' payloads (scaled copies of this one's ranges), summed in their order.
    rows = [np.stack([lo, scale * (r + 1)], 1).reshape(-1).astype(np.float32) for r in range(4)]
    joined = tf.constant(np.concatenate(rows))
    total = quantizer.decode(tf.concat([codes] * 4, 0), joined, bits, LARGE, chunk, summed=True).numpy()
    want = np.zeros(LARGE, np.float32)
    for r in range(4):
        want = (want + ref.dequantize(want_codes, lo, (scale * (r + 1)).astype(np.float32), chunk)).astype(np.float32)
    np.testing.assert_array_equal(total, want)
    each = quantizer.decode(tf.concat([codes] * 2, 0), joined[:2 * lo.size * 2], bits, LARGE, chunk).numpy()
    np.testing.assert_array_equal(each[LARGE:], ref.dequantize(want_codes, lo, (scale * 2).astype(np.float32), chunk))

    np.save(tmp_path / "flat.npy", flat)
    done = subprocess.run([sys.executable, "-c", ONE_THREAD, str(tmp_path / "flat.npy"), str(tmp_path / "one.npz")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TFSYNC_KERNELS_SSE2": "1"})
    assert done.returncode == 0, done.stderr
    one = np.load(tmp_path / "one.npz")
    np.testing.assert_array_equal(one[f"codes{bits}"], codes.numpy())
    np.testing.assert_array_equal(one[f"lo_scale{bits}"], lo_scale.numpy())


def test_the_kernels_refuse_a_payload_that_is_not_whole_rows():
    from tfsyncmodes.exchange import quantize

    quantizer = quantize.Quantizer("native")
    codes, lo_scale = quantizer.encode(tf.constant(sample(1001)), 4, 6.0, 100)  # 501 bytes, 11 chunks
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a whole number of rows of 501"):
        quantizer.decode(codes[:-1], lo_scale, 4, 1001, 100)
    with pytest.raises(tf.errors.InvalidArgumentError, match="lo_scale holds 21 floats, not 22"):
        quantizer.decode(codes, lo_scale[:-1], 4, 1001, 100)
    with pytest.raises(ValueError, match="quantization implementation 'fast': use one of auto, native, ops"):
        quantize.Quantizer("fast")


def test_the_index_kernels_refuse_indices_out_of_order_or_range_and_counts_that_do_not_add_up():
    from tfsyncmodes.exchange import kernels
    from tfsyncmodes.exchange.quantized import pack_indices, unpack_indices

    native = kernels.choose("native", "Top-K")
    with pytest.raises(tf.errors.InvalidArgumentError, match="index 3 follows 7: pack indices in increasing order"):
        pack_indices(tf.constant([1, 7, 3], tf.int32), 100_000, native)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"index 100000 is outside \[0, 100000\)"):
        pack_indices(tf.constant([1, 100_000], tf.int32), 100_000, native)
    low, counts = pack_indices(tf.constant([1, 70_000], tf.int32), 100_000, native)  # 2 blocks
    np.testing.assert_array_equal(unpack_indices(low, counts, 100_000, native).numpy(), [1, 70_000])
    with pytest.raises(tf.errors.InvalidArgumentError, match="the counts add up to 1, not the 2 low parts"):
        unpack_indices(low, tf.constant([1, 0], tf.int32), 100_000, native)
    with pytest.raises(tf.errors.InvalidArgumentError, match="count 3 of block 0 does not fit the 2 low parts"):
        unpack_indices(low, tf.constant([3, 0], tf.int32), 100_000, native)
    with pytest.raises(tf.errors.InvalidArgumentError, match="3 counts are not a whole number of 2 blocks"):
        unpack_indices(low, tf.constant([1, 1, 0], tf.int32), 100_000, native)


@pytest.mark.parametrize("name", ["int8", "int2", "topk_int4", "topk"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_per_tensor_compresses_each_tensor_of_the_vector_on_its_own(name, implementation):
    """Hybrid's --sync_compression_per_tensor: a scale (a selection) per tensor, empty tensors
    skipped; several ranks' joined payloads decompress to their sum; a fragment goes whole."""
    from tfsyncmodes.exchange.compressors import payload_bytes
    from tfsyncmodes.exchange.flat import TensorContext
    from tfsyncmodes.exchange.per_tensor import PerTensor

    sizes = [3000, 0, 70_000, 7]
    layers = tuple(TensorContext(f"t{i}", (size,)) for i, size in enumerate(sizes))
    whole = TensorContext("flat", (sum(sizes),), layers)
    extra = {"ratio": 0.05} if name.startswith("topk") else {}
    compressor = PerTensor(make(name, implementation=implementation, **extra))
    assert compressor.sparse and not compressor.lossless
    flats = [sample(whole.size, seed) for seed in range(3)]
    flats[0][3000:] *= 1e-3  # a tensor of small changes keeps a scale (a selection) of its own

    def roundtrip(flat):
        parts = np.split(flat, np.cumsum(sizes)[:-1])
        if name == "topk":
            dense = [reference.topk_decompress(*reference.topk_compress(p, 0.05), p.size) if p.size else p
                     for p in parts]
            return np.concatenate(dense), sum(8 * int(np.ceil(0.05 * p.size)) for p in parts if p.size)
        return ref.per_tensor_roundtrip(flat, [s for s in sizes if s], name, 0.05)

    payloads = [compressor.compress(tf.constant(f), whole) for f in flats]
    want, wire = roundtrip(flats[0])
    np.testing.assert_array_equal(compressor.decompress(payloads[0], whole).numpy(), want)
    assert int(payload_bytes(payloads[0])) == wire == sum(
        int(np.prod(shape)) * dtype.size for dtype, shape in compressor.payload_spec(whole))
    np.testing.assert_array_equal(compressor.sent_mask(payloads[0], whole).numpy(), (want != 0).astype(np.float32))
    # One scale (selection) over the whole vector loses the small tensors' changes.
    flat_only = (reference.topk_decompress(*reference.topk_compress(flats[0], 0.05), whole.size) if name == "topk"
                 else ref.quantized_roundtrip(flats[0], name, 0.05)[0])
    if name.startswith("topk"):  # over the vector only their outliers are selected; per tensor 5 %
        sent = [int(np.count_nonzero(got[3000:])) for got in (flat_only, want)]
        assert sent[0] < 0.02 * 70_000 and sent[1] >= 0.05 * 70_000, sent
    else:
        error = [np.median(np.abs(got[3000:] - flats[0][3000:])) for got in (flat_only, want)]
        assert error[0] > 10 * error[1], error
    joined = tuple(tf.concat([p[i] for p in payloads], 0) for i in range(len(payloads[0])))
    total = np.zeros(whole.size, np.float32)
    for f in flats:
        total = (total + roundtrip(f)[0]).astype(np.float32)
    np.testing.assert_array_equal(compressor.decompress(joined, whole).numpy(), total)
    fragment = whole.part(100, 5100, "fragment_0")  # a block of entries: no tensors, compressed whole
    inner = make(name, implementation=implementation, **extra)
    np.testing.assert_array_equal(
        compressor.decompress(compressor.compress(tf.constant(flats[1][100:5100]), fragment), fragment).numpy(),
        inner.decompress(inner.compress(tf.constant(flats[1][100:5100]), fragment), fragment).numpy())
