// A TensorFlow CPU kernel whose attribute `size` is the entry count of the dense vector it
// writes or indexes (the scatter of Top-K, the packed indices' blocks).
#ifndef TFSYNC_SIZED_OP_H_
#define TFSYNC_SIZED_OP_H_

#include "tensorflow/core/framework/op_kernel.h"

namespace tfsync {

class SizedOp : public tensorflow::OpKernel {
 public:
  explicit SizedOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("size", &size_));
  }

 protected:
  int size_;
};

}  // namespace tfsync

#endif  // TFSYNC_SIZED_OP_H_
