// Launchers of the fused decode-path kernels for RMSNorm (optionally with the residual add before
// it) and SwiGLU's silu(gate) · up, in plain C++ (raw pointers, no ATen) so the .cu compiles
// standalone with nvcc. Not the dispatch (nn/rms_norm.cpp and nn/mlp.cpp pick these kernels or
// their tensor-op references) and no backward: inference only.
#pragma once
#include <cstdint>

#include "quantized_matmul.h"  // QDtype

namespace hearth::kernels {

/// How an RMSNorm applies its weight, after h = fp32(s) and r = rsqrt(Σh²·(1/C) + eps):
enum class NormWeight {
  kAfterRound,  // y = round(w · round(h · r)): LlamaRMSNorm (weight in dtype times the rounded norm)
  kFp32,        // y = round(h · r · (offset + fp32(w))): Gemma4RMSNorm (offset 0), Qwen3_5RMSNorm (offset 1)
  kNone,        // y = round(h · r): a weightless norm (Gemma 4's v_norm); weight may be nullptr
};

/// One RMSNorm call's operands; device memory on the current CUDA device, row-major, rows of x
/// `x_stride` elements apart (0 = C), everything else contiguous.
struct RmsNormArgs {
  const void* x = nullptr;          // [N, C] in dtype (row stride x_stride)
  const void* residual = nullptr;   // [N, C] in dtype, or nullptr (no add before the norm)
  void* sum = nullptr;              // [N, C] out, x + residual in dtype (only with residual; may not alias x)
  const void* weight = nullptr;     // [C] in dtype (unused with NormWeight::kNone)
  const void* gate = nullptr;       // [N, C] in dtype, or nullptr: y = round(round(normed) · silu(fp32(gate)))
  const void* add_after = nullptr;  // [N, C] in dtype, or nullptr: y = round(fp32(add_after) + round(normed))
  void* y = nullptr;                // [N, C] out in dtype (may not alias x, residual, sum, gate or add_after)
  QDtype dtype = QDtype::kFloat32;
  NormWeight mode = NormWeight::kAfterRound;
  float weight_offset = 0.f;        // kFp32 only
  int64_t N = 0, C = 0, x_stride = 0;
  float eps = 1e-6f;
  void* stream = nullptr;           // cudaStream_t; nullptr = the legacy default stream
};

/// Per row, with PyTorch's roundings: s = x (+ residual, added in fp32 and rounded to dtype, also
/// written to `sum`); h = fp32(s); r = rsqrt(Σh²·(1/C) + eps); normed per `mode` (LlamaRMSNorm by
/// default); then optionally Qwen3_5RMSNormGated's `· silu(gate)` or a sandwich norm's residual add
/// after it (`residual + norm(x)`, Gemma 4), each one more rounding as the reference's separate op.
/// One block per row, one launch — where the reference launches ~7–10 kernels over fp32 copies. From
/// 16 rows (prompt chunks), rows whose length and stride are whole 16-byte vectors go through shared
/// memory with 16-byte loads and stores; the summation order, and so every bit, is the same. The sum of squares runs in another order than
/// PyTorch's reduction, so y may differ from the reference by one rounding of dtype. Asynchronous on
/// `stream`. Returns nullptr on success, else a one-line reason (bad sizes, a missing operand, gate
/// and add_after together, or the CUDA launch error string).
const char* rms_norm(const RmsNormArgs& a);

/// y = round(round(silu(gate)) · up) elementwise over n elements of dtype, silu(g) = g / (1 +
/// exp(−g)) in fp32: at::silu(gate) * up in one launch, bit-identical to it (16-byte vectors where n
/// and the operands' alignment allow). Asynchronous on
/// `stream`; returns nullptr on success, else a one-line reason.
const char* silu_mul(const void* gate, const void* up, void* y, QDtype dtype, int64_t n, void* stream);

}  // namespace hearth::kernels
