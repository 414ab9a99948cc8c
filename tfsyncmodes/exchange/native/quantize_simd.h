// The vector passes of the quantization kernels (quantize_ops.cc): the float64 sums, minimum
// and maximum of a block, its squared deviations, and its codes, with AVX2 (eight entries to a
// register) on a CPU that has it and SSE2 (four; every x86-64 CPU) otherwise. Each takes what
// it can of [0, m) and returns how far it got; plain C++ (quantize_rule.h) does the rest, and
// all of it elsewhere. Included by quantize_ops.cc only.
#ifndef TFSYNC_QUANTIZE_SIMD_H_
#define TFSYNC_QUANTIZE_SIMD_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TFSYNC_AVX2 1
#define TFSYNC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TFSYNC_CLONES
#endif

namespace {

// A vector pass's partial results folded into the running ones: four float64 sums, and the
// minimum and maximum over `lanes` lanes.
inline void Fold(const double* parts, const float* lows, const float* highs, int lanes, double* sums, float* mn,
                 float* mx) {
  for (int j = 0; j < 4; ++j) sums[j] += parts[j];
  for (int j = 0; j < lanes; ++j) {
    *mn = std::min(*mn, lows[j]);
    *mx = std::max(*mx, highs[j]);
  }
}

#ifdef TFSYNC_AVX2
// AVX2 is checked once, at load time: the library is built for any x86-64. The float64 sums
// are split over more partial sums than with SSE2; the codes are the same bits.
// TFSYNC_KERNELS_SSE2=1 takes the SSE2 passes on any CPU (the tests compare the two).
const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && std::getenv("TFSYNC_KERNELS_SSE2") == nullptr;

__attribute__((target("avx2"))) int64_t MomentsAvx2(const float* x, int64_t m, double* sums, float* mn, float* mx) {
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
  __m256 low = _mm256_set1_ps(x[0]), high = low;
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const __m256 v = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(x + i + 8);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    s2 = _mm256_add_pd(s2, _mm256_cvtps_pd(_mm256_castps256_ps128(w)));
    s3 = _mm256_add_pd(s3, _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1)));
    low = _mm256_min_ps(low, _mm256_min_ps(v, w));
    high = _mm256_max_ps(high, _mm256_max_ps(v, w));
  }
  double parts[4];
  float lows[8], highs[8];
  _mm256_storeu_pd(parts, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
  _mm256_storeu_ps(lows, low);
  _mm256_storeu_ps(highs, high);
  Fold(parts, lows, highs, 8, sums, mn, mx);
  return i;
}

__attribute__((target("avx2"))) int64_t SquaresAvx2(const float* x, int64_t m, double mean, double* squares) {
  const __m256d center = _mm256_set1_pd(mean);
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const __m256 v = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(x + i + 8);
    const __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), center);
    const __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), center);
    const __m256d d2 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(w)), center);
    const __m256d d3 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(w, 1)), center);
    s0 = _mm256_add_pd(s0, _mm256_mul_pd(d0, d0));
    s1 = _mm256_add_pd(s1, _mm256_mul_pd(d1, d1));
    s2 = _mm256_add_pd(s2, _mm256_mul_pd(d2, d2));
    s3 = _mm256_add_pd(s3, _mm256_mul_pd(d3, d3));
  }
  double parts[4];
  _mm256_storeu_pd(parts, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
  for (int j = 0; j < 4; ++j) squares[j] += parts[j];
  return i;
}

__attribute__((target("avx2"))) inline __m256i Code8(const float* p, __m256 lo, __m256 hi, __m256 scale,
                                                     __m256 top) {
  const __m256 shift = _mm256_set1_ps(8388608.0f);
  __m256 r = _mm256_div_ps(_mm256_sub_ps(_mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(p), lo), hi), lo), scale);
  r = _mm256_min_ps(_mm256_sub_ps(_mm256_add_ps(r, shift), shift), top);
  return _mm256_cvttps_epi32(r);
}

__attribute__((target("avx2"))) int64_t CodesAvx2(const float* x, int64_t m, float lo, float hi, float scale,
                                                  float top, uint8_t* out) {
  const __m256 lo8 = _mm256_set1_ps(lo), hi8 = _mm256_set1_ps(hi), scale8 = _mm256_set1_ps(scale);
  const __m256 top8 = _mm256_set1_ps(top);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
  for (; i + 32 <= m; i += 32) {
    // Packing works within each 128-bit half; the permutation puts the 32 bytes back in order.
    const __m256i a = _mm256_packs_epi32(Code8(x + i, lo8, hi8, scale8, top8), Code8(x + i + 8, lo8, hi8, scale8, top8));
    const __m256i b = _mm256_packs_epi32(Code8(x + i + 16, lo8, hi8, scale8, top8),
                                         Code8(x + i + 24, lo8, hi8, scale8, top8));
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bytes);
  }
  return i;
}
#endif

#ifdef __SSE2__
int64_t MomentsSse2(const float* x, int64_t m, double* sums, float* mn, float* mx) {
  __m128d s0 = _mm_setzero_pd(), s1 = s0;
  __m128 low = _mm_set1_ps(x[0]), high = low;
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const __m128 v = _mm_loadu_ps(x + i);
    s0 = _mm_add_pd(s0, _mm_cvtps_pd(v));
    s1 = _mm_add_pd(s1, _mm_cvtps_pd(_mm_movehl_ps(v, v)));
    low = _mm_min_ps(low, v);
    high = _mm_max_ps(high, v);
  }
  double parts[4];
  float lows[4], highs[4];
  _mm_storeu_pd(parts, s0);
  _mm_storeu_pd(parts + 2, s1);
  _mm_storeu_ps(lows, low);
  _mm_storeu_ps(highs, high);
  Fold(parts, lows, highs, 4, sums, mn, mx);
  return i;
}

int64_t SquaresSse2(const float* x, int64_t m, double mean, double* squares) {
  const __m128d center = _mm_set1_pd(mean);
  __m128d s0 = _mm_setzero_pd(), s1 = s0;
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const __m128 v = _mm_loadu_ps(x + i);
    const __m128d d0 = _mm_sub_pd(_mm_cvtps_pd(v), center);
    const __m128d d1 = _mm_sub_pd(_mm_cvtps_pd(_mm_movehl_ps(v, v)), center);
    s0 = _mm_add_pd(s0, _mm_mul_pd(d0, d0));
    s1 = _mm_add_pd(s1, _mm_mul_pd(d1, d1));
  }
  double parts[4];
  _mm_storeu_pd(parts, s0);
  _mm_storeu_pd(parts + 2, s1);
  for (int j = 0; j < 4; ++j) squares[j] += parts[j];
  return i;
}

int64_t CodesSse2(const float* x, int64_t m, float lo, float hi, float scale, float top, uint8_t* out) {
  const __m128 lo4 = _mm_set1_ps(lo), hi4 = _mm_set1_ps(hi), scale4 = _mm_set1_ps(scale);
  const __m128 top4 = _mm_set1_ps(top), shift4 = _mm_set1_ps(8388608.0f);
  auto code4 = [&](const float* p) {
    __m128 r = _mm_div_ps(_mm_sub_ps(_mm_min_ps(_mm_max_ps(_mm_loadu_ps(p), lo4), hi4), lo4), scale4);
    r = _mm_min_ps(_mm_sub_ps(_mm_add_ps(r, shift4), shift4), top4);
    return _mm_cvttps_epi32(r);
  };
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const __m128i low = _mm_packs_epi32(code4(x + i), code4(x + i + 4));
    const __m128i high = _mm_packs_epi32(code4(x + i + 8), code4(x + i + 12));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi16(low, high));
  }
  return i;
}
#endif

}  // namespace

#endif  // TFSYNC_QUANTIZE_SIMD_H_
