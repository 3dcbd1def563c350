// The x86 SIMD (AVX-512 / AVX2 + FMA, picked at run time) CPU kernel of quantized_matmul for MLX
// affine 4- and 8-bit weights: y = x · dequantize(W)ᵀ in fp32 with the weight decoded in registers.
// Not the dispatch between kernels (nn/quant.cpp) and not quantization itself.
#pragma once
#include <ATen/ATen.h>

#include "nn/quant.h"

namespace hearth::nn::simd {

/// Instruction sets the kernel has a version for, best last.
enum class Isa { kNone = 0, kAvx2 = 1, kAvx512 = 2 };

/// The best Isa this CPU and build support (kNone off x86-64 or without AVX2+FMA), lowered to the
/// cap set by set_isa_cap and to the environment variable HEARTH_CPU_ISA (none | avx2 | avx512;
/// for A/B measurements: none runs the portable kernels). Detected once (cpuid via
/// __builtin_cpu_supports). Throws hearth::Error naming HEARTH_CPU_ISA on another value.
Isa active_isa();

/// Caps the Isa the kernel may use (tests run every version on one machine); returns the previous
/// cap. The cap starts at kAvx512 (no cap). Not thread-safe against concurrent matmuls.
Isa set_isa_cap(Isa cap);

/// y[m, r] = Σ_k x[m, k] · (scales[r, k/gs] · q[r, k] + biases[r, k/gs]) for every m < M, r < out:
/// x fp32 [M, in] contiguous (for 4 bits in "group-split" order: each group's even elements then
/// its odd ones, as quant.cpp's split_groups_even_odd writes it), qw.wq contiguous, scales and
/// biases [out, in/gs] contiguous in fp32/bf16/f16, y fp32 [M, out]. Each weight element is
/// decoded once per block of up to 8 (AVX-512) or 4 (AVX2) rows of x and fused-multiply-added into
/// all of them, so the cost per row falls as M grows. Sums in fp32 in another order than BLAS (and
/// w = fma(s, q, b) rounds once): within fp32 rounding of quantized_matmul_ref.
/// Returns false, computing nothing, when active_isa() is kNone or bits ∉ {4, 8}. Parallel over
/// output rows (at::parallel_for). Shapes are the caller's to check (quant.cpp's check_qweight).
bool quantized_matmul_simd(const float* x, int64_t M, const QuantizedWeight& qw, const at::Tensor& scales,
                           const at::Tensor& biases, float* y);

/// Dequantizes weight rows [r0, r0 + n) of `qw` (bits 4/8) into fp32 dst [n, in], row-major in
/// natural column order: w = fma(q, scale, bias) per group (one rounding; dequantize() computes
/// q·s + b with two). qw.wq, scales and biases [out, in/gs] contiguous, scales/biases in
/// fp32/bf16/f16. Returns false, writing nothing, when active_isa() is kNone or bits ∉ {4, 8}.
/// Single-threaded (the caller spreads row blocks over threads). Shapes are the caller's to check.
bool dequantize_rows_simd(const QuantizedWeight& qw, const at::Tensor& scales, const at::Tensor& biases, int64_t r0,
                          int64_t n, float* dst);

}  // namespace hearth::nn::simd
