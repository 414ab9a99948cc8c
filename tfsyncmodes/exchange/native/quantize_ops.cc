// Uniform quantization with mu +- k sigma clipping and its inverse, as two TensorFlow CPU kernels
// that give the same bits as the TensorFlow ops of tfsyncmodes/exchange/quantize.py (its
// docstring states the rule; tests/test_quantize.py checks both against NumPy).
//
// TfsyncQuantize(flat: float[n], clip_sigma: double) -> codes: uint8[ceil(n * bits / 8)],
//                                                      lo_scale: float[2 * chunks]
//   Per chunk of `chunk` entries (0: one chunk): mu and sigma in float64 (two passes, as the
//   rule), the range clipped to the chunk's min and max, scale = (hi - lo) / (2**bits - 1) in
//   float32, codes round half to even, packed 8 / bits to a byte, little end first.
// TfsyncDequantize(codes: uint8[rows * packed], lo_scale: float[rows * 2 * chunks])
//   -> values: float[rows * n], or float[n] with `sum`: lo + code * scale per entry (one
//   product, one sum, each rounded), and with `sum` the rows added in their order
//   ((row 0 + row 1) + row 2) + ..., a block of entries at a time so the sum stays in cache.
//
// The arithmetic is quantize_rule.h's and quantize_simd.h's; this file registers the ops and
// splits their blocks over TensorFlow's CPU threads.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/threadpool.h"

#include "quantize_rule.h"

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;

int64_t PackedSize(int64_t count, int bits) { return (count * bits + 7) / 8; }

int64_t NumChunks(int64_t count, int64_t chunk) {
  return (chunk <= 0 || chunk >= count) ? 1 : (count + chunk - 1) / chunk;
}

absl::Status CheckBits(int bits) {
  if (bits == 8 || bits == 4 || bits == 2) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("bits = ", bits, ": use 8, 4 or 2"));
}

REGISTER_OP("TfsyncQuantize")
    .Input("flat: float")
    .Input("clip_sigma: double")
    .Output("codes: uint8")
    .Output("lo_scale: float")
    .Attr("bits: int")
    .Attr("chunk: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      int bits;
      int64_t chunk;
      TF_RETURN_IF_ERROR(c->GetAttr("bits", &bits));
      TF_RETURN_IF_ERROR(c->GetAttr("chunk", &chunk));
      TF_RETURN_IF_ERROR(CheckBits(bits));
      tensorflow::shape_inference::ShapeHandle flat;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &flat));
      const DimensionHandle n = c->Dim(flat, 0);
      if (!c->ValueKnown(n)) {
        c->set_output(0, c->Vector(c->UnknownDim()));
        c->set_output(1, c->Vector(c->UnknownDim()));
      } else {
        c->set_output(0, c->Vector(PackedSize(c->Value(n), bits)));
        c->set_output(1, c->Vector(2 * NumChunks(c->Value(n), chunk)));
      }
      return absl::OkStatus();
    });

REGISTER_OP("TfsyncDequantize")
    .Input("codes: uint8")
    .Input("lo_scale: float")
    .Output("values: float")
    .Attr("bits: int")
    .Attr("count: int >= 1")
    .Attr("chunk: int >= 0")
    .Attr("sum: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      int64_t count;
      bool sum;
      TF_RETURN_IF_ERROR(c->GetAttr("count", &count));
      TF_RETURN_IF_ERROR(c->GetAttr("sum", &sum));
      c->set_output(0, c->Vector(sum ? c->MakeDim(count) : c->UnknownDim()));
      return absl::OkStatus();
    });

// Entries per block: the unit of work the kernels split over TensorFlow's CPU threads (a
// multiple of 4, so a block starts on a byte of packed codes at every width).
constexpr int64_t kBlock = 16384;

// Runs fn(first, last) over [0, total) units on the op's CPU threads.
void Parallel(OpKernelContext* ctx, int64_t total, int64_t cost_per_unit,
              const std::function<void(int64_t, int64_t)>& fn) {
  ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(total, cost_per_unit, fn);
}

class QuantizeOp : public OpKernel {
 public:
  explicit QuantizeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bits", &bits_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("chunk", &chunk_));
    OP_REQUIRES_OK(ctx, CheckBits(bits_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, input.dims() == 1 && input.dim_size(0) > 0,
                absl::InvalidArgumentError("flat must be 1-D and not empty"));
    OP_REQUIRES(ctx, ctx->input(1).dims() == 0, absl::InvalidArgumentError("clip_sigma must be a scalar"));
    const double clip_sigma = ctx->input(1).scalar<double>()();
    const int64_t n = input.dim_size(0);
    const int64_t chunks = NumChunks(n, chunk_);
    const int64_t width = chunks > 1 ? chunk_ : n;
    Tensor* codes = nullptr;
    Tensor* lo_scale = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({PackedSize(n, bits_)}), &codes));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({2 * chunks}), &lo_scale));
    const float* x = input.flat<float>().data();
    float* pairs = lo_scale->flat<float>().data();
    uint8_t* packed = codes->flat<uint8_t>().data();

    // Blocks of at most kBlock entries that never cross a chunk's end; first[c] is chunk c's
    // first block.
    const int64_t per_chunk = (width + kBlock - 1) / kBlock;
    std::vector<int64_t> begins, chunk_of, first(chunks + 1);
    for (int64_t c = 0; c < chunks; ++c) {
      first[c] = begins.size();
      for (int64_t b = 0; b < per_chunk && c * width + b * kBlock < n; ++b) {
        begins.push_back(c * width + b * kBlock);
        chunk_of.push_back(c);
      }
    }
    const int64_t blocks = begins.size();
    first[chunks] = blocks;
    auto end_of = [&](int64_t b) { return std::min({n, begins[b] + kBlock, (chunk_of[b] + 1) * width}); };

    std::vector<Stats> stats(blocks);
    Parallel(ctx, blocks, 8 * kBlock, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) stats[b] = BlockStats(x + begins[b], end_of(b) - begins[b]);
    });
    std::vector<Bounds> ranges(chunks);
    for (int64_t c = 0; c < chunks; ++c) {
      ranges[c] = Combine(stats.data() + first[c], first[c + 1] - first[c], bits_, clip_sigma);
      pairs[2 * c] = ranges[c].lo;
      pairs[2 * c + 1] = ranges[c].scale;
    }
    // With 8 bits a code is its byte; otherwise the codes go to a scratch row, packed after.
    std::unique_ptr<uint8_t[]> scratch(bits_ == 8 ? nullptr : new uint8_t[n]);
    uint8_t* raw = bits_ == 8 ? packed : scratch.get();
    Parallel(ctx, blocks, 8 * kBlock, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) Codes(x + begins[b], end_of(b) - begins[b], ranges[chunk_of[b]], bits_, raw + begins[b]);
    });
    if (bits_ != 8) {
      const int64_t bytes = PackedSize(n, bits_);
      const int64_t block_bytes = kBlock * bits_ / 8;
      Parallel(ctx, (bytes + block_bytes - 1) / block_bytes, 2 * kBlock, [&](int64_t lo, int64_t hi) {
        Pack(raw, n, bits_, lo * block_bytes, std::min(bytes, hi * block_bytes), packed);
      });
    }
  }

 private:
  int bits_;
  int64_t chunk_;
};

class DequantizeOp : public OpKernel {
 public:
  explicit DequantizeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bits", &bits_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("count", &count_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("chunk", &chunk_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sum", &sum_));
    OP_REQUIRES_OK(ctx, CheckBits(bits_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& codes = ctx->input(0);
    const Tensor& lo_scale = ctx->input(1);
    const int64_t packed_size = PackedSize(count_, bits_);
    const int64_t chunks = NumChunks(count_, chunk_);
    const int64_t width = chunks > 1 ? chunk_ : count_;
    OP_REQUIRES(ctx, codes.dims() == 1 && codes.dim_size(0) > 0 && codes.dim_size(0) % packed_size == 0,
                absl::InvalidArgumentError(absl::StrCat("codes hold ", codes.NumElements(),
                                                        " bytes, not a whole number of rows of ", packed_size)));
    const int64_t rows = codes.dim_size(0) / packed_size;
    OP_REQUIRES(ctx, lo_scale.dims() == 1 && lo_scale.dim_size(0) == rows * 2 * chunks,
                absl::InvalidArgumentError(absl::StrCat("lo_scale holds ", lo_scale.NumElements(), " floats, not ",
                                                        rows * 2 * chunks, " (", rows, " rows)")));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({sum_ ? count_ : rows * count_}), &values));
    const uint8_t* packed = codes.flat<uint8_t>().data();
    const float* pairs = lo_scale.flat<float>().data();
    float* out = values->flat<float>().data();
    // Block by block, each row's codes in their order: with `sum`, every row is added into the
    // block while it is in cache, ((row 0 + row 1) + row 2) + ... as the rows come.
    const int64_t blocks = (count_ + kBlock - 1) / kBlock;
    Parallel(ctx, blocks, 4 * kBlock * rows, [&](int64_t lo, int64_t hi) {
      std::unique_ptr<uint8_t[]> block_codes(new uint8_t[kBlock]);
      for (int64_t b = lo; b < hi; ++b) {
        const int64_t begin = b * kBlock, end = std::min(count_, begin + kBlock);
        for (int64_t r = 0; r < rows; ++r) {
          Unpack(packed + r * packed_size, bits_, begin, end, block_codes.get());
          float* row_out = sum_ ? out : out + r * count_;
          for (int64_t i = begin; i < end;) {  // one chunk's segment at a time
            const int64_t c = i / width, stop = std::min(end, (c + 1) * width);
            const float* pair = pairs + r * 2 * chunks + 2 * c;
            Scale(block_codes.get() + (i - begin), stop - i, pair[0], pair[1], sum_ && r > 0, row_out + i);
            i = stop;
          }
        }
      }
    });
  }

 private:
  int bits_;
  int64_t count_;
  int64_t chunk_;
  bool sum_;
};

REGISTER_KERNEL_BUILDER(Name("TfsyncQuantize").Device(tensorflow::DEVICE_CPU), QuantizeOp);
REGISTER_KERNEL_BUILDER(Name("TfsyncDequantize").Device(tensorflow::DEVICE_CPU), DequantizeOp);

}  // namespace
