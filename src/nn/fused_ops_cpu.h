// The fused ops of nn/fused_ops.h on the CPU for fp32 inference: one loop each where the reference
// launches ~8 ATen ops (RMSNorm after a residual add) or ~7 (RoPE). A small model's decode step on
// this 2-core machine is dispatch-bound (~600 top-level ATen ops a token for the starter), so the ops
// saved are the time saved. Called by nn/fused_ops.cpp only; not the modules.
#pragma once
#include <ATen/ATen.h>

#include <utility>

namespace hearth::nn {
namespace cpu_fused {

/// {s, y} of nn::add_rms_norm for CPU fp32 x, residual (or undefined) [..., C], weight [C], all
/// contiguous and nothing for autograd to record: s = x + residual (the same bits), y = weight ·
/// (h · r) with r = 1 / sqrt(mean(h²) + eps) as LlamaRMSNorm rounds in fp32, the sum of squares
/// accumulated in double (y within a rounding or two of the reference's fp32 reduction). Both
/// undefined, computing nothing, when it does not apply (the caller runs the reference ops).
std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                               double eps);

/// nn::fused_rotary on the CPU: x [B, H, T, D] fp32 (any strides, last dim contiguous), cos/sin
/// [T or 1, rot] or [B or 1, 1, T or 1, rot] fp32 with a contiguous last dim, rot even ≤ D →
/// x·cos + rotate_half(x)·sin on the first rot dims, the rest copied; bit-identical to
/// apply_rotary's tensor ops (each product and the sum rounded to fp32, no fused multiply-add), laid
/// out as they lay it out: contiguous when x is, else x's strides. Undefined tensor when it does not
/// apply.
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace cpu_fused

/// The RoPE operands both fused paths take (this file's rotary and nn::fused_rotary's CUDA kernel):
/// x [B, H, T, D] with a contiguous last dim; cos and sin of equal sizes and strides, last dim
/// contiguous, rot = cos.size(-1) even in [2, D], shaped [T or 1, rot] or [B or 1, 1, T or 1, rot].
/// Sets the element strides between the tables' rows for b and for t (0 where they broadcast) and
/// returns true; false for any other operands.
bool rotary_table_strides(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t& cs_b,
                          int64_t& cs_t);

}  // namespace hearth::nn
