// MLX affine quantization (the mlx-community checkpoint format): packing, quantize, dequantize
// and a quantized matmul that never materializes the whole dequantized matrix.
// Follows mlx's `mx.quantize(w, group_size, bits)` (mode "affine"): per group of `group_size`
// consecutive input elements, w ≈ scale · q + bias, q in [0, 2^bits); q values are packed
// little-endian into uint32 words (bit i of the stream = bit i%32 of word i/32), so a row of
// `in` elements occupies in * bits / 32 words. Bits 2, 3, 4, 5, 6, 8; group sizes 32, 64, 128.
#pragma once
#include <ATen/ATen.h>

namespace hearth::nn {

/// Quantization spec of one module.
struct QuantSpec {
  int bits = 4;
  int group_size = 64;
  bool operator==(const QuantSpec&) const = default;
};

/// Throws hearth::Error unless bits ∈ {2,3,4,5,6,8} and group_size ∈ {32,64,128}; `where` names
/// the module/config field in the message.
void check_quant_spec(const QuantSpec& spec, const std::string& where);

/// The quantized form of a [out, in] matrix.
struct QuantizedWeight {
  at::Tensor wq;      // [out, in*bits/32] uint32 bits (stored as kInt)
  at::Tensor scales;  // [out, in/group_size], float dtype of the source (bf16/f16/f32)
  at::Tensor biases;  // [out, in/group_size], same dtype as scales
  QuantSpec spec;
  int64_t in_features() const;   // wq.size(1) * 32 / bits
  int64_t out_features() const;  // wq.size(0)
};

/// Quantizes `w` [out, in] (in divisible by group_size) exactly as mlx's affine quantize does
/// (mlx/backend/cpu/quantized.cpp): per group, in fp32, w_min/w_max; scale = max((w_max-w_min)/
/// (2^bits-1), 1e-7), negated unless |w_min| > |w_max|; the larger-magnitude edge e is kept exact:
/// q0 = rint(e/scale), and if q0 != 0 then scale = e/q0, bias = e (else bias = 0); codes =
/// clamp(rint((w-bias)/scale), 0, 2^bits-1). Scales/biases are stored in w's dtype (bf16/f16;
/// anything else gives f32). CPU only (other devices are copied to CPU).
QuantizedWeight quantize(const at::Tensor& w, QuantSpec spec);

/// Reference dequantization: [out, in] in `dtype` (default: scales' dtype), w = scales·q + biases,
/// computed in fp32 then cast once (mlx computes in the scales' dtype: for bf16 scales results may
/// differ from mlx by one bf16 rounding).
at::Tensor dequantize(const QuantizedWeight& qw, c10::optional<at::ScalarType> dtype = c10::nullopt);

/// Unpacks wq [out, in*bits/32] (kInt) to integer codes q [out, in] (kByte). Throws on a width
/// that does not hold `in_features` codes.
at::Tensor unpack_codes(const at::Tensor& wq, int bits, int64_t in_features);

/// unpack_codes with tensor ops on wq's own device (what unpack_codes uses off the CPU), for
/// bits 2, 4 and 8 (widths that divide a 32-bit word): wq [out, in*bits/32] kInt → codes
/// [out, in] uint8. Throws for other widths or a wrong shape.
at::Tensor unpack_codes_on_device(const at::Tensor& wq, int bits, int64_t in_features);

/// Packs integer codes q [out, in] (any integer dtype, values in [0, 2^bits), in % 32 == 0) into
/// wq [out, in*bits/32] (kInt holding uint32 bits), the inverse of unpack_codes. Throws on codes out
/// of range.
at::Tensor pack_codes(const at::Tensor& codes, int bits);

/// y = x · dequantize(qw)ᵀ for x [..., in] → [..., out] in x's dtype, accumulated in fp32.
/// CPU: M = x.numel()/in <= 64 at bits 4/8 runs the AVX-512/AVX2 kernel of nn/quant_simd.h
/// (weight decoded in registers once per block of rows of x; row m of the result is bit-identical
/// to the product of x's row m alone); without those instruction sets M <= 8 at bits 4/8 decodes
/// codes fused with the dot; other small M decode one row at a time; larger M dequantize a tile of
/// rows at a time + GEMM (never the whole matrix): with nn/cpu_gemm.h's fast GEMM each thread
/// dequantizes its own block of rows (SIMD for bits 4/8) and multiplies with a single-threaded
/// sgemm; without it (HEARTH_CPU_GEMM=aten, a ReferenceKernelsScope) tiles + BLAS. CUDA builds, x on a CUDA device: M <= 8 at bits 4/8 with x in
/// f32/f16/bf16 runs the fused GEMV of kernels/quantized_matmul.h; anything else dequantizes the
/// whole matrix + matmul (quantized_matmul_ref). Throws on shape mismatch or a failed kernel launch.
at::Tensor quantized_matmul(const at::Tensor& x, const QuantizedWeight& qw);

/// Reference for quantized_matmul: dequantize whole matrix, then matmul (tests and fallbacks).
at::Tensor quantized_matmul_ref(const at::Tensor& x, const QuantizedWeight& qw);

}  // namespace hearth::nn
