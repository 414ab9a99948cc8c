"""NumPy references for the quantizing compressors and Deep Gradient Compression's corrections,
written from their documented rules (not from the implementation):

- quantization, per chunk: mu and sigma in float64, lo = max(float32(mu - k sigma), min),
  hi = min(float32(mu + k sigma), max), scale = float32(hi - lo) / (2**bits - 1), codes =
  round half to even ((clip(x, lo, hi) - lo) / scale) (0 when scale is 0), value = lo + code *
  scale in float32;
- packing: 8 / bits codes per byte, code j in bits [bits * j, bits * (j + 1));
- DGC: u = m u + g, v = v + u, send Top-K(v), v = v - sent, u = 0 where sent; local clipping
  to clip_norm / sqrt(N); warm-up densities 0.25, 0.0625, ... above the ratio, equal shares of
  the warm-up steps.
"""
import numpy as np

from tests import reference


def chunks_of(flat, chunk):
    if chunk <= 0 or chunk >= flat.size:
        return [flat]
    return [flat[i:i + chunk] for i in range(0, flat.size, chunk)]


def quantize(flat, bits, clip_sigma=6.0, chunk=0):
    """(codes uint8 [n], lo float32 [chunks], scale float32 [chunks])."""
    levels = 2 ** bits - 1
    codes, los, scales = [], [], []
    for part in chunks_of(np.asarray(flat, np.float32), chunk):
        mu = part.astype(np.float64).mean()
        sigma = part.astype(np.float64).std()
        lo = max(np.float32(mu - clip_sigma * sigma), part.min())
        hi = max(min(np.float32(mu + clip_sigma * sigma), part.max()), lo)
        scale = np.float32((np.float32(hi) - np.float32(lo)) / np.float32(levels))
        if scale > 0:
            c = np.rint((np.clip(part, lo, hi) - np.float32(lo)) / scale)  # rint: half to even
            codes.append(np.clip(c, 0, levels).astype(np.uint8))
        else:
            codes.append(np.zeros(part.size, np.uint8))
        los.append(np.float32(lo))
        scales.append(scale)
    return np.concatenate(codes), np.array(los, np.float32), np.array(scales, np.float32)


def dequantize(codes, lo, scale, chunk=0):
    n = codes.size
    width = n if chunk <= 0 or chunk >= n else chunk
    which = np.arange(n) // width
    return (lo[which] + codes.astype(np.float32) * scale[which]).astype(np.float32)


def pack(codes, bits):
    per = 8 // bits
    padded = np.zeros(-(-codes.size // per) * per, np.uint32)
    padded[:codes.size] = codes
    rows = padded.reshape(-1, per)
    return sum(rows[:, j] << (bits * j) for j in range(per)).astype(np.uint8)


def unpack(packed, bits, count):
    per = 8 // bits
    mask = (1 << bits) - 1
    codes = np.stack([(packed.astype(np.uint32) >> (bits * j)) & mask for j in range(per)], axis=1)
    return codes.reshape(-1)[:count].astype(np.uint8)


def quantized_roundtrip(flat, compression, ratio=0.01, clip_sigma=6.0, chunk=0):
    """What `compression` (int8/int4/int2 or topk_int*) sends of `flat`, dense, and its wire bytes."""
    bits = int(compression.split("int")[-1])
    if compression.startswith("topk"):
        _, indices = reference.topk_compress(flat, ratio)
        indices = np.sort(indices)
        codes, lo, scale = quantize(flat[indices], bits, clip_sigma, chunk)
        dense = reference.topk_decompress(dequantize(codes, lo, scale, chunk), indices, flat.size)
        # Indices packed: a uint16 low part each, an int32 count per block of 2**16 entries.
        return dense, pack(codes, bits).size + 8 * lo.size + 2 * indices.size + 4 * index_blocks(flat.size)
    codes, lo, scale = quantize(flat, bits, clip_sigma, chunk)
    return dequantize(codes, lo, scale, chunk), pack(codes, bits).size + 8 * lo.size


def index_blocks(size):
    return max(1, -(-size // 2 ** 16))


def packed_indices(indices, size):
    """Sorted indices as (low 16 bits, the count in each block of 2**16 entries)."""
    return (indices % 2 ** 16).astype(np.uint16), np.bincount(indices // 2 ** 16, minlength=index_blocks(size))


def warmup_ratio(step, ratio, warmup_steps, factor=0.25):
    """The Top-K ratio of step `step` (from 0) under DGC's exponential warm-up."""
    stages = []
    density = factor
    while warmup_steps and density > ratio:
        stages.append(density)
        density *= factor
    if not stages or step >= warmup_steps:
        return ratio
    return stages[step * len(stages) // warmup_steps]


def clip_global(grad, norm):
    total = np.sqrt(np.sum(grad.astype(np.float64) ** 2))
    return grad if total <= norm else (grad * np.float32(norm / total)).astype(np.float32)


def per_tensor_roundtrip(flat, sizes, compression, ratio=0.01, clip_sigma=6.0):
    """`quantized_roundtrip` of each tensor of `flat` (entries of `sizes` in turn) on its own:
    (what is sent, dense; the wire bytes of all the payloads)."""
    parts = np.split(flat, np.cumsum(sizes)[:-1])
    sent = [quantized_roundtrip(part, compression, ratio, clip_sigma) for part in parts]
    return np.concatenate([dense for dense, _ in sent]), sum(size for _, size in sent)


def compressed_sync_training(kernel, bias, x, y, compression, ratio=0.01, clip_sigma=6.0, dgc=False,
                             momentum=0.9, clip_norm=None, warmup_steps=0, lr=reference.LR, masking=True,
                             per_tensor=False):
    """Sync SGD in float32 with a quantizing (or, with `dgc`, a Top-K) compression: every rank
    compensates its gradient (error feedback; with `dgc`, momentum correction, the momentum
    zeroed where sent unless `masking` is off), compresses it, keeps what it left out; every
    rank applies the mean of all payloads, decompressed and summed in rank order; `per_tensor`:
    the kernel's and the bias's entries each compressed on their own. Returns [kernel, bias]."""
    if per_tensor and (dgc or compression == "topk"):
        raise ValueError("per_tensor: this replay splits quantizing compressions (int*, topk_int*) only")
    params = [np.asarray(kernel, np.float32), np.asarray(bias, np.float32)]
    replicas, size = x.shape[1], reference._flat(params).size
    residual = [np.zeros(size, np.float32) for _ in range(replicas)]
    velocity = [np.zeros(size, np.float32) for _ in range(replicas)]
    for step in range(x.shape[0]):
        step_ratio = warmup_ratio(step, ratio, warmup_steps) if dgc else ratio
        total = np.zeros(size, np.float32)
        for r in range(replicas):
            grad = reference._flat(reference.mse_gradients(*[p.astype(np.float64) for p in params],
                                                           x[step, r], y[step, r])).astype(np.float32)
            if clip_norm is not None:
                grad = clip_global(grad, clip_norm / np.sqrt(replicas))
            if dgc:
                velocity[r] = (np.float32(momentum) * velocity[r] + grad).astype(np.float32)
                compensated = (residual[r] + velocity[r]).astype(np.float32)
            else:
                compensated = (grad + residual[r]).astype(np.float32)
            if compression == "topk":
                values, indices = reference.topk_compress(compensated, step_ratio)
                sent = reference.topk_decompress(values, indices, size)
            elif per_tensor:
                sent, _ = per_tensor_roundtrip(compensated, [p.size for p in params], compression, step_ratio,
                                               clip_sigma)
            else:
                sent, _ = quantized_roundtrip(compensated, compression, step_ratio, clip_sigma)
            residual[r] = (compensated - sent).astype(np.float32)
            if dgc and masking:
                unsent = np.ones(size, np.float32)
                unsent[reference.topk_compress(compensated, step_ratio)[1]] = 0.0
                velocity[r] = velocity[r] * unsent
            total = (total + sent).astype(np.float32)
        mean = total / np.float32(replicas)
        params = reference._unflat(reference._flat(params) - np.float32(lr) * mean, params)
    return params
