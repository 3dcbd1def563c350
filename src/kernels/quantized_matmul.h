// Launcher of the fused CUDA GEMV for MLX affine quantized weights (small M: decode; the kernel is
// kernels/gemv.cu's affine case), in plain C++
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

}  // namespace hearth::kernels
