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

/// Quantizes `w` [out, in] (in divisible by group_size) exactly as mlx's affine quantize does.
QuantizedWeight quantize(const at::Tensor& w, QuantSpec spec);

/// Reference dequantization: [out, in] in `dtype` (default: scales' dtype), w = scales·q + biases.
at::Tensor dequantize(const QuantizedWeight& qw, c10::optional<at::ScalarType> dtype = c10::nullopt);

/// Unpacks wq to integer codes q [out, in] (kByte for bits ≤ 8).
at::Tensor unpack_codes(const at::Tensor& wq, int bits, int64_t in_features);

/// y = x · dequantize(qw)ᵀ for x [..., in] → [..., out] in x's dtype. CPU: a vectorized kernel
/// that dequantizes one group-row tile at a time (never the whole matrix); other devices: a
/// plain-libtorch path. Throws on shape mismatch.
at::Tensor quantized_matmul(const at::Tensor& x, const QuantizedWeight& qw);

/// Reference for quantized_matmul: dequantize whole matrix, then matmul (tests and fallbacks).
at::Tensor quantized_matmul_ref(const at::Tensor& x, const QuantizedWeight& qw);

}  // namespace hearth::nn
