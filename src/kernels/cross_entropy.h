// Launcher of the fused cross-entropy forward + backward over a chunk of logits (training's loss
// head), in plain C++ (raw pointers, no ATen) so the .cu compiles standalone with nvcc. Not the
// dispatch (train/loss.cpp picks this kernel or the autograd reference) and not a CPU path.
#pragma once
#include <cstdint>

#include "quantized_matmul.h"  // QDtype

namespace hearth::kernels {

/// One call's operands; every pointer is device memory on the current CUDA device, contiguous.
struct CrossEntropyArgs {
  const void* logits = nullptr;    // [N, V] in dtype (a chunk's logits, row-major)
  QDtype dtype = QDtype::kFloat32;
  const int64_t* targets = nullptr;  // [N]; ignore_index (or any value outside [0, V)) = no loss
  int64_t ignore_index = -100;
  float scale = 1.f;               // the gradient is of scale · Σ CE
  float* loss_rows = nullptr;      // [N] out: logsumexp(row) − row[target], 0 for ignored rows
  void* grad = nullptr;            // [N, V] out, in dtype: scale · (softmax(row) − onehot(target)); 0 for ignored rows
  int64_t N = 0, V = 0;
  void* stream = nullptr;          // cudaStream_t; nullptr = the legacy default stream
};

/// Per row of logits: CE = logsumexp(x) − x[target] in fp32 (x upcast from dtype) and its gradient
/// scale · (exp(x − lse) − [j == target]) rounded once to dtype, in one launch that reads each
/// row from memory about once and writes the gradient once — what autograd's upcast, logsumexp,
/// gather and their backward do in about eight passes over an fp32 copy. `grad` may not alias
/// `logits`. Rows whose target is ignore_index get loss 0 and a zero gradient; a target outside
/// [0, V) that is not ignore_index is treated the same (the caller checks targets). Asynchronous
/// on `stream`. Returns nullptr on success, else a one-line reason (bad sizes or the CUDA launch
/// error string). Follows torch's log_softmax / nll_loss definitions (aten/src/ATen/native/
/// LossNLL.cpp, SoftMax.cpp).
const char* cross_entropy_fwd_bwd(const CrossEntropyArgs& a);

}  // namespace hearth::kernels
