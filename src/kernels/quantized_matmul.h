// Launchers of the fused CUDA GEMV for MLX affine quantized weights (small M: decode; the kernel is
// kernels/gemv.cu's affine case) and of their one-pass dequantize (prefill), in plain C++
// (raw pointers, no ATen) so the .cu compiles standalone with nvcc. Not the dispatch (nn/quant.cpp
// picks this kernel or the dequantize + matmul reference) and not a CPU path.
#pragma once
#include <cstdint>

namespace hearth::kernels {

/// Element types the kernel reads and writes.
enum class QDtype : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

/// One call's operands; every pointer is device memory on the current CUDA device, contiguous,
/// row-major and 16-byte aligned.
struct QuantGemvArgs {
  const void* x = nullptr;          // [M, in] in x_dtype
  QDtype x_dtype = QDtype::kFloat32;
  const uint32_t* wq = nullptr;     // [out, in*bits/32] packed codes (MLX layout, see nn/quant.h)
  const void* scales = nullptr;     // [out, in/group_size] in s_dtype
  const void* biases = nullptr;     // [out, in/group_size] in s_dtype
  QDtype s_dtype = QDtype::kFloat32;  // x_dtype or kFloat32
  void* y = nullptr;                // [M, out] in x_dtype
  int64_t M = 0, out = 0, in = 0;
  int bits = 4, group_size = 64;
  void* stream = nullptr;           // cudaStream_t; nullptr = the legacy default stream
};

/// True when quantized_gemv handles this case: bits 4 or 8, group_size 32/64/128, 1 <= M <= 8,
/// s_dtype == x_dtype or kFloat32, in % group_size == 0.
bool quantized_gemv_supported(int bits, int group_size, int64_t M, int64_t in, QDtype x_dtype, QDtype s_dtype);

/// y = x · Wᵀ with W[o, k] = scale[o, k/gs] · q[o, k] + bias[o, k/gs] (mlx's affine dequantize),
/// accumulated in fp32, written in x_dtype. Asynchronous on `stream`. Returns nullptr on success,
/// else a one-line reason (unsupported case, misaligned pointer, or the CUDA launch error string).
const char* quantized_gemv(const QuantGemvArgs& a);

/// One dequantize call's operands (device memory, contiguous, row-major).
struct AffineDequantArgs {
  const uint32_t* wq = nullptr;     // [out, in*bits/32] packed codes, code k of a row at bits k·bits.. of its words
  const void* scales = nullptr;     // [out, in/group_size] in s_dtype
  const void* biases = nullptr;     // [out, in/group_size] in s_dtype
  QDtype s_dtype = QDtype::kFloat32;
  void* w = nullptr;                // [out, in] out in w_dtype (16-byte aligned)
  QDtype w_dtype = QDtype::kFloat32;
  int64_t out = 0, in = 0;
  int bits = 4, group_size = 64;    // bits 2, 4 or 8; group_size 32, 64 or 128 dividing in
  void* stream = nullptr;           // cudaStream_t; nullptr = the legacy default stream
};

/// W[o, k] = round_w(fp32(q[o, k]) · fp32(scale[o, g]) + fp32(bias[o, g])), g = k / group_size, the
/// product and the sum each rounded to fp32 (no fused multiply-add): bit for bit nn::dequantize's
/// tensor ops (nn/quant.cpp), in one pass that reads the packed codes once and writes W once (the ops
/// make ~8 passes over fp32 and int32 copies). The prefill path of MLX-quantized layers on CUDA
/// (dequantize, then cuBLAS). Asynchronous on `stream`. Returns nullptr on success, else a one-line
/// reason (unsupported bits/group size/shape, misaligned output, or the CUDA launch error string).
const char* affine_dequantize(const AffineDequantArgs& a);

}  // namespace hearth::kernels
