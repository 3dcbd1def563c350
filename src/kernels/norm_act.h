// Launchers of the fused decode-path kernels for RMSNorm (optionally with the residual add before
// it) and SwiGLU's silu(gate) · up, in plain C++ (raw pointers, no ATen) so the .cu compiles
// standalone with nvcc. Not the dispatch (nn/rms_norm.cpp and nn/mlp.cpp pick these kernels or
// their tensor-op references) and no backward: inference only.
#pragma once
#include <cstdint>

#include "quantized_matmul.h"  // QDtype

namespace hearth::kernels {

/// One RMSNorm call's operands; device memory on the current CUDA device, contiguous, row-major.
struct RmsNormArgs {
  const void* x = nullptr;         // [N, C] in dtype
  const void* residual = nullptr;  // [N, C] in dtype, or nullptr (no add)
  void* sum = nullptr;             // [N, C] out, x + residual in dtype (only with residual; may not alias x)
  const void* weight = nullptr;    // [C] in dtype
  void* y = nullptr;               // [N, C] out in dtype (may not alias x, residual or sum)
  QDtype dtype = QDtype::kFloat32;
  int64_t N = 0, C = 0;
  float eps = 1e-6f;
  void* stream = nullptr;          // cudaStream_t; nullptr = the legacy default stream
};

/// Per row, in transformers' LlamaRMSNorm op order with PyTorch's roundings: s = x (+ residual,
/// added in fp32 and rounded to dtype, also written to `sum`); h = fp32(s); r = rsqrt(Σh²·(1/C) +
/// eps); y = round(w · round(h · r)). One block per row, one launch, reading each row twice (the
/// second time from cache) — where the reference launches ~7 kernels over fp32 copies. The sum of
/// squares runs in another order than PyTorch's reduction, so y may differ from the reference by
/// one rounding of dtype. Asynchronous on `stream`. Returns nullptr on success, else a one-line
/// reason (bad sizes or the CUDA launch error string).
const char* rms_norm(const RmsNormArgs& a);

/// y = round(round(silu(gate)) · up) elementwise over n elements of dtype, silu(g) = g / (1 +
/// exp(−g)) in fp32: at::silu(gate) * up in one launch, bit-identical to it. Asynchronous on
/// `stream`; returns nullptr on success, else a one-line reason.
const char* silu_mul(const void* gate, const void* up, void* y, QDtype dtype, int64_t n, void* stream);

}  // namespace hearth::kernels
