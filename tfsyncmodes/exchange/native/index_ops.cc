// The packed indices of the quantized Top-K payloads, as two small TensorFlow CPU kernels: the
// same integers as the TensorFlow ops of tfsyncmodes/exchange/quantized.py, in one pass each.
//
// TfsyncPackIndices(indices: int32[k], size) -> low: uint16[k], counts: int32[blocks]
//   Indices in increasing order, each in [0, size), as their low 16 bits and the count of
//   indices in each block of 65,536 entries (blocks = max(1, ceil(size / 65,536))). An index
//   outside [0, size) or out of order is an InvalidArgument error.
// TfsyncUnpackIndices(low: uint16[n], counts: int32[m * blocks], size) -> indices: int32[n]
//   One or several ranks' packed indices, concatenated, back as int32: counts[j] indices of
//   block j % blocks, in the order of `low`. Counts that are negative or do not add up to n
//   are an InvalidArgument error.
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

#include "sized_op.h"

namespace {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

constexpr int64_t kBlock = 1 << 16;  // entries per block: a low part fits uint16

int64_t Blocks(int64_t size) { return size <= kBlock ? 1 : (size + kBlock - 1) / kBlock; }

REGISTER_OP("TfsyncPackIndices")
    .Input("indices: int32")
    .Output("low: uint16")
    .Output("counts: int32")
    .Attr("size: int >= 0")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int size;
      TF_RETURN_IF_ERROR(c->GetAttr("size", &size));
      tensorflow::shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      c->set_output(0, c->input(0));
      c->set_output(1, c->Vector(Blocks(size)));
      return absl::OkStatus();
    });

REGISTER_OP("TfsyncUnpackIndices")
    .Input("low: uint16")
    .Input("counts: int32")
    .Output("indices: int32")
    .Attr("size: int >= 0")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

class PackIndicesOp : public tfsync::SizedOp {
 public:
  using SizedOp::SizedOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& indices = ctx->input(0);
    OP_REQUIRES(ctx, indices.dims() == 1, absl::InvalidArgumentError("indices must be 1-D"));
    const int64_t k = indices.dim_size(0);
    const int64_t blocks = Blocks(size_);
    Tensor* low = nullptr;
    Tensor* counts = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k}), &low));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({blocks}), &counts));
    const int32_t* in = indices.flat<int32_t>().data();
    uint16_t* out = low->flat<uint16_t>().data();
    int32_t* count = counts->flat<int32_t>().data();
    std::memset(count, 0, sizeof(int32_t) * blocks);
    for (int64_t i = 0; i < k; ++i) {
      OP_REQUIRES(ctx, in[i] >= 0 && in[i] < size_,
                  absl::InvalidArgumentError(absl::StrCat("index ", in[i], " is outside [0, ", size_, ")")));
      OP_REQUIRES(ctx, i == 0 || in[i - 1] <= in[i],
                  absl::InvalidArgumentError(absl::StrCat("index ", in[i], " follows ", in[i - 1],
                                                          ": pack indices in increasing order")));
      out[i] = static_cast<uint16_t>(in[i] % kBlock);
      ++count[in[i] / kBlock];
    }
  }
};

class UnpackIndicesOp : public tfsync::SizedOp {
 public:
  using SizedOp::SizedOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& low = ctx->input(0);
    const Tensor& counts = ctx->input(1);
    OP_REQUIRES(ctx, low.dims() == 1 && counts.dims() == 1,
                absl::InvalidArgumentError("low parts and counts must be 1-D"));
    const int64_t n = low.dim_size(0);
    const int64_t blocks = Blocks(size_);
    const int64_t m = counts.dim_size(0);
    OP_REQUIRES(ctx, m % blocks == 0,
                absl::InvalidArgumentError(absl::StrCat(m, " counts are not a whole number of ", blocks, " blocks")));
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &indices));
    const uint16_t* in = low.flat<uint16_t>().data();
    const int32_t* count = counts.flat<int32_t>().data();
    int32_t* out = indices->flat<int32_t>().data();
    int64_t at = 0;
    for (int64_t j = 0; j < m; ++j) {
      OP_REQUIRES(ctx, count[j] >= 0 && at + count[j] <= n,
                  absl::InvalidArgumentError(absl::StrCat("count ", count[j], " of block ", j,
                                                          " does not fit the ", n, " low parts")));
      const int32_t base = static_cast<int32_t>((j % blocks) * kBlock);
      for (int32_t i = 0; i < count[j]; ++i, ++at) out[at] = base + static_cast<int32_t>(in[at]);
    }
    OP_REQUIRES(ctx, at == n,
                absl::InvalidArgumentError(absl::StrCat("the counts add up to ", at, ", not the ", n, " low parts")));
  }
};

REGISTER_KERNEL_BUILDER(Name("TfsyncPackIndices").Device(tensorflow::DEVICE_CPU), PackIndicesOp);
REGISTER_KERNEL_BUILDER(Name("TfsyncUnpackIndices").Device(tensorflow::DEVICE_CPU), UnpackIndicesOp);

}  // namespace
