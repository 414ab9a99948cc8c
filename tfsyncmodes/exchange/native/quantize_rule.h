// The rule of the quantization kernels (quantize_ops.cc) in plain C++ over a block of entries:
// its range from the blocks' stats, its codes, their packing and unpacking, and the values.
// Built with -ffp-contract=off (tfsyncmodes/exchange/kernels.py): a fused multiply-add would
// round once where the rule rounds twice. Included by quantize_ops.cc only.
#ifndef TFSYNC_QUANTIZE_RULE_H_
#define TFSYNC_QUANTIZE_RULE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quantize_simd.h"

namespace {

struct Bounds {  // a chunk's range by the rule
  float lo, hi, scale;
};

// A block's count, sum, sum of squared deviations from its own mean, minimum and maximum: two
// passes over the block, the second in cache. The vector passes (quantize_simd.h) take what
// they can and plain C++ the rest (all of it on a CPU without them).
struct Stats {
  double count = 0, sum = 0, m2 = 0;
  float mn = 0, mx = 0;
};

Stats BlockStats(const float* x, int64_t m) {
  double sums[4] = {0, 0, 0, 0};
  Stats out;
  out.mn = out.mx = x[0];
  int64_t i = 0;
#ifdef TFSYNC_AVX2
  if (kHaveAvx2) i = MomentsAvx2(x, m, sums, &out.mn, &out.mx);
#endif
#ifdef __SSE2__
  i += MomentsSse2(x + i, m - i, sums, &out.mn, &out.mx);
#endif
  for (; i < m; ++i) {
    sums[0] += static_cast<double>(x[i]);
    out.mn = std::min(out.mn, x[i]);
    out.mx = std::max(out.mx, x[i]);
  }
  out.count = static_cast<double>(m);
  out.sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
  const double mean = out.sum / out.count;
  double squares[4] = {0, 0, 0, 0};
  i = 0;
#ifdef TFSYNC_AVX2
  if (kHaveAvx2) i = SquaresAvx2(x, m, mean, squares);
#endif
#ifdef __SSE2__
  i += SquaresSse2(x + i, m - i, mean, squares);
#endif
  for (; i < m; ++i) {
    const double d = static_cast<double>(x[i]) - mean;
    squares[0] += d * d;
  }
  out.m2 = (squares[0] + squares[1]) + (squares[2] + squares[3]);
  return out;
}

// A chunk's range by the rule from its blocks' stats, taken in their order (so the result does
// not depend on how many threads computed them). The float64 mean and deviation are combined
// as in Chan, Golub and LeVeque's pairwise update: the sum of the blocks' squared deviations plus
// each block's count times the square of its mean's distance from the chunk's, as exact as two
// passes over the chunk. The order of float64 sums is not the rule's concern: its float32 range
// is what is compared, and TensorFlow's own reductions have an order of their own.
Bounds Combine(const Stats* blocks, int64_t count, int bits, double clip_sigma) {
  double n = 0, sum = 0;
  float mn = blocks[0].mn, mx = blocks[0].mx;
  for (int64_t b = 0; b < count; ++b) {
    n += blocks[b].count;
    sum += blocks[b].sum;
    mn = std::min(mn, blocks[b].mn);
    mx = std::max(mx, blocks[b].mx);
  }
  const double mean = sum / n;
  double m2 = 0;
  for (int64_t b = 0; b < count; ++b) {
    const double d = blocks[b].sum / blocks[b].count - mean;
    m2 += blocks[b].m2 + blocks[b].count * d * d;
  }
  const double std_dev = std::sqrt(m2 / n);
  Bounds out;
  out.lo = std::max(static_cast<float>(mean - clip_sigma * std_dev), mn);
  out.hi = std::max(std::min(static_cast<float>(mean + clip_sigma * std_dev), mx), out.lo);
  out.scale = (out.hi - out.lo) / static_cast<float>((1 << bits) - 1);
  return out;
}

// Codes of x[0, m), one uint8 each. Round half to even: adding and taking away 2**23 leaves a
// float in [0, 2**23) rounded to an integer in the default rounding mode (to nearest, ties to
// even), with no call to the C library. The division stays a division (not a product with
// 1 / scale, which rounds differently).
void Codes(const float* x, int64_t m, const Bounds& range, int bits, uint8_t* out) {
  if (!(range.scale > 0)) {
    std::memset(out, 0, m);
    return;
  }
  const float lo = range.lo, hi = range.hi, scale = range.scale;
  const float top = static_cast<float>((1 << bits) - 1);
  int64_t i = 0;
#ifdef TFSYNC_AVX2
  if (kHaveAvx2) i = CodesAvx2(x, m, lo, hi, scale, top, out);
#endif
#ifdef __SSE2__
  i += CodesSse2(x + i, m - i, lo, hi, scale, top, out + i);
#endif
  for (; i < m; ++i) {
    float t = x[i] > lo ? x[i] : lo;
    t = t < hi ? t : hi;
    float r = (t - lo) / scale;
    r = (r + 8388608.0f) - 8388608.0f;
    r = r < top ? r : top;
    out[i] = static_cast<uint8_t>(static_cast<int32_t>(r));
  }
}

// Bytes [first, last) of the packed codes from the raw codes raw[0, n), 8 / bits to a byte.
void Pack(const uint8_t* raw, int64_t n, int bits, int64_t first, int64_t last, uint8_t* packed) {
  const int per_byte = 8 / bits;
  const int64_t whole = std::min(last, n / per_byte);
  if (bits == 4) {
    for (int64_t b = first; b < whole; ++b) packed[b] = raw[2 * b] | (raw[2 * b + 1] << 4);
  } else {
    for (int64_t b = first; b < whole; ++b) {
      packed[b] = raw[4 * b] | (raw[4 * b + 1] << 2) | (raw[4 * b + 2] << 4) | (raw[4 * b + 3] << 6);
    }
  }
  if (whole < last) {  // the last byte, padded with zero codes
    uint8_t tail = 0;
    for (int64_t i = whole * per_byte, j = 0; i < n; ++i, ++j) tail |= raw[i] << (bits * j);
    packed[whole] = tail;
  }
}

// The codes of entries [begin, end) of one row, one uint8 each (begin a multiple of 4).
TFSYNC_CLONES void Unpack(const uint8_t* packed, int bits, int64_t begin, int64_t end, uint8_t* codes) {
  if (bits == 8) {
    std::memcpy(codes, packed + begin, end - begin);
    return;
  }
  const int per_byte = 8 / bits;
  const uint8_t* bytes = packed + begin / per_byte;
  const int64_t m = end - begin;
  if (bits == 4) {
    for (int64_t i = 0; i + 2 <= m; i += 2) {
      codes[i] = bytes[i / 2] & 15;
      codes[i + 1] = bytes[i / 2] >> 4;
    }
  } else {
    for (int64_t i = 0; i + 4 <= m; i += 4) {
      const uint8_t byte = bytes[i / 4];
      codes[i] = byte & 3;
      codes[i + 1] = (byte >> 2) & 3;
      codes[i + 2] = (byte >> 4) & 3;
      codes[i + 3] = byte >> 6;
    }
  }
  for (int64_t i = m - m % per_byte; i < m; ++i) codes[i] = (bytes[i / per_byte] >> (bits * (i % per_byte))) & ((1 << bits) - 1);
}

// lo + code * scale for m codes, written to out or added to it. The compiler vectorizes the
// loops; a copy for AVX2 CPUs is picked at load time (the library is built for any x86-64).
TFSYNC_CLONES void Scale(const uint8_t* codes, int64_t m, float lo, float scale, bool add, float* out) {
  if (add) {
    for (int64_t i = 0; i < m; ++i) out[i] = out[i] + (lo + static_cast<float>(codes[i]) * scale);
  } else {
    for (int64_t i = 0; i < m; ++i) out[i] = lo + static_cast<float>(codes[i]) * scale;
  }
}

}  // namespace

#endif  // TFSYNC_QUANTIZE_RULE_H_
