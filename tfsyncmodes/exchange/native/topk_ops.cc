// Exact Top-K by magnitude and its dense inverse, as two small TensorFlow CPU kernels.
//
// TfsyncTopKMagnitude(flat: float[n], k) -> values: float[k], indices: int32[k]
//   The k entries of largest |x|, ties broken towards the lower index (the order of a stable
//   sort by decreasing magnitude, as tf.math.top_k), returned in increasing index order.
//   Magnitudes are compared as the bit patterns of |x| (sign bit cleared): for finite and
//   infinite values that is the order of |x|, and it is a total order, so a NaN (whose
//   pattern lies above infinity's) ranks as the largest magnitude instead of breaking the sort.
//   Selection as in Deep Gradient Compression (Lin et al., ICLR 2018): a threshold from a
//   sample spread evenly over the input, set to keep about 1.3 k entries; one pass over the
//   input (its blocks split over TensorFlow's CPU threads) keeps the entries at or above it;
//   nth_element finds the exact k-th among them. If the threshold kept fewer than k entries,
//   the pass runs again with a threshold that keeps four times as many sampled entries and
//   finally with none (every entry is a candidate): always exact.
// TfsyncScatterDense(values: float[m], indices: int32[m], size) -> float[size]
//   Zeros with values[i] added at indices[i] (entries sharing an index add up); an index
//   outside [0, size) is an InvalidArgument error.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/threadpool.h"

#include "sized_op.h"

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

REGISTER_OP("TfsyncTopKMagnitude")
    .Input("flat: float")
    .Output("values: float")
    .Output("indices: int32")
    .Attr("k: int >= 1")
    .Attr("sample_size: int = 8192")
    .Attr("margin: float = 1.3")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int k;
      TF_RETURN_IF_ERROR(c->GetAttr("k", &k));
      tensorflow::shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      c->set_output(0, c->Vector(k));
      c->set_output(1, c->Vector(k));
      return absl::OkStatus();
    });

REGISTER_OP("TfsyncScatterDense")
    .Input("values: float")
    .Input("indices: int32")
    .Output("dense: float")
    .Attr("size: int >= 0")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int size;
      TF_RETURN_IF_ERROR(c->GetAttr("size", &size));
      c->set_output(0, c->Vector(size));
      return absl::OkStatus();
    });

inline uint32_t Key(uint32_t bits) { return bits & 0x7fffffffu; }

// A candidate as one integer: larger magnitude first, then the lower index (a strict total
// order, so std::greater on it ranks candidates exactly as a stable sort would).
inline uint64_t Rank(uint32_t key, int64_t index) {
  return (static_cast<uint64_t>(key) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(index));
}

inline int32_t IndexOf(uint64_t rank) { return static_cast<int32_t>(~static_cast<uint32_t>(rank)); }

class TopKMagnitudeOp : public OpKernel {
 public:
  explicit TopKMagnitudeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("k", &k_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sample_size", &sample_size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("margin", &margin_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, input.dims() == 1, absl::InvalidArgumentError("flat must be 1-D"));
    const int64_t n = input.dim_size(0);
    OP_REQUIRES(ctx, n < (int64_t{1} << 31), absl::InvalidArgumentError("flat has 2**31 entries or more"));
    OP_REQUIRES(ctx, k_ <= n, absl::InvalidArgumentError(absl::StrCat("k = ", k_, " exceeds the ", n, " entries")));
    const float* x = input.flat<float>().data();
    // The bit patterns of the entries: |x| is then the pattern with the sign bit cleared.
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(x);
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k_}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({k_}), &indices));
    float* out_values = values->flat<float>().data();
    int32_t* out_indices = indices->flat<int32_t>().data();

    std::vector<uint64_t> candidates;
    for (int attempt = 0; candidates.size() < static_cast<size_t>(k_); ++attempt) {
      const uint32_t threshold = attempt < 2 ? Threshold(bits, n, attempt == 0 ? 1.0 : 4.0) : 0u;
      candidates.clear();
      CollectAll(ctx, bits, n, threshold, &candidates);
    }
    // The exact k-th best candidate (ranks are distinct), then the candidates ranked at least as
    // high, taken in their (index) order: no sort of the output.
    uint64_t kth = 0;
    if (candidates.size() > static_cast<size_t>(k_)) {
      std::vector<uint64_t> ranked(candidates);
      std::nth_element(ranked.begin(), ranked.begin() + (k_ - 1), ranked.end(), std::greater<uint64_t>());
      kth = ranked[k_ - 1];
    }
    int out = 0;
    for (const uint64_t rank : candidates) {
      if (rank >= kth) {
        out_indices[out] = IndexOf(rank);
        out_values[out] = x[out_indices[out]];
        ++out;
      }
    }
    OP_REQUIRES(ctx, out == k_, absl::InternalError(absl::StrCat("selected ", out, " entries, not ", k_)));
  }

 private:
  static constexpr int64_t kSampleRun = 64; // contiguous entries per sampled run (4 cache lines)

  // Every entry whose key is at least `threshold`, in index order. With SSE2 (every x86-64
  // CPU), 16 entries are compared at once into a bit mask and only its set bits are visited,
  // so the pass runs at about the speed of reading the update; elsewhere, plain C++.
  static void Collect(const uint32_t* bits, int64_t begin, int64_t n, uint32_t threshold,
                      std::vector<uint64_t>* out) {
    int64_t start = begin;
#ifdef __SSE2__
    // Keys are below 2**31, so a signed comparison with threshold - 1 is key >= threshold.
    const __m128i below = _mm_set1_epi32(static_cast<int32_t>(threshold) - 1);
    const __m128i magnitude = _mm_set1_epi32(0x7fffffff);
    for (; start + 16 <= n; start += 16) {
      const __m128i* block = reinterpret_cast<const __m128i*>(bits + start);
      uint32_t mask = 0;
      for (int part = 0; part < 4; ++part) {
        const __m128i keys = _mm_and_si128(_mm_loadu_si128(block + part), magnitude);
        mask |= static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(keys, below)))) << (4 * part);
      }
      while (mask) {
        const int64_t i = start + __builtin_ctz(mask);
        out->push_back(Rank(Key(bits[i]), i));
        mask &= mask - 1;
      }
    }
#endif
    for (int64_t i = start; i < n; ++i) {
      if (Key(bits[i]) >= threshold) out->push_back(Rank(Key(bits[i]), i));
    }
  }

  // Collect over the whole input, its blocks split over TensorFlow's CPU threads, each into a
  // list of its own, joined in block order (so in index order, whatever the threads).
  void CollectAll(OpKernelContext* ctx, const uint32_t* bits, int64_t n, uint32_t threshold,
                  std::vector<uint64_t>* out) const {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    std::vector<std::vector<uint64_t>> found(blocks);
    const size_t expect = threshold ? static_cast<size_t>(2.0 * margin_ * k_ * kBlock / n) + 16 : kBlock;
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
        blocks, 2 * kBlock, [&](int64_t first, int64_t last) {
          for (int64_t b = first; b < last; ++b) {
            found[b].reserve(expect);
            Collect(bits, b * kBlock, std::min(n, (b + 1) * kBlock), threshold, &found[b]);
          }
        });
    size_t total = 0;
    for (const auto& part : found) total += part.size();
    out->reserve(total);
    for (const auto& part : found) out->insert(out->end(), part.begin(), part.end());
  }

  static constexpr int64_t kBlock = 65536;  // entries a thread's unit of the collection (a multiple of 16)

  // The key that about `scale` * margin * k / n of a sample reach (0: every entry is a
  // candidate). The sample is sample_size entries in evenly spaced runs of kSampleRun
  // contiguous entries: spread over the whole update (so over every layer it concatenates)
  // like DGC's strided sample, with a sixteenth of its cache-line reads.
  uint32_t Threshold(const uint32_t* bits, int64_t n, double scale) const {
    if (n <= 4 * static_cast<int64_t>(sample_size_) || 8 * static_cast<int64_t>(k_) > n) return 0u;
    const int64_t runs = std::max<int64_t>(1, sample_size_ / kSampleRun);
    const int64_t gap = n / runs;
    std::vector<uint32_t> sample;
    sample.reserve(runs * kSampleRun);
    for (int64_t r = 0; r < runs; ++r) {
      for (int64_t i = r * gap; i < std::min(n, r * gap + kSampleRun); ++i) sample.push_back(Key(bits[i]));
    }
    const double want = scale * margin_ * static_cast<double>(k_) / n * sample.size();
    const int64_t keep = std::max<int64_t>(1, static_cast<int64_t>(want) + 1);
    if (keep >= static_cast<int64_t>(sample.size())) return 0u;
    std::nth_element(sample.begin(), sample.begin() + (keep - 1), sample.end(), std::greater<uint32_t>());
    return sample[keep - 1];
  }

  int k_;
  int sample_size_;
  float margin_;
};

class ScatterDenseOp : public tfsync::SizedOp {
 public:
  using SizedOp::SizedOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(0);
    const Tensor& indices = ctx->input(1);
    OP_REQUIRES(ctx, values.dims() == 1 && indices.dims() == 1 && values.dim_size(0) == indices.dim_size(0),
                absl::InvalidArgumentError("values and indices must be 1-D of the same length"));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({size_}), &dense));
    float* out = dense->flat<float>().data();
    std::memset(out, 0, sizeof(float) * size_);
    const float* v = values.flat<float>().data();
    const int32_t* idx = indices.flat<int32_t>().data();
    const int64_t m = values.dim_size(0);
    for (int64_t i = 0; i < m; ++i) {
      OP_REQUIRES(ctx, idx[i] >= 0 && idx[i] < size_,
                  absl::InvalidArgumentError(absl::StrCat("index ", idx[i], " is outside [0, ", size_, ")")));
      out[idx[i]] += v[i];
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("TfsyncTopKMagnitude").Device(tensorflow::DEVICE_CPU), TopKMagnitudeOp);
REGISTER_KERNEL_BUILDER(Name("TfsyncScatterDense").Device(tensorflow::DEVICE_CPU), ScatterDenseOp);

}  // namespace
