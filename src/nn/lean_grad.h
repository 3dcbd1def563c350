// Memory-lean autograd for the per-position ops of a training layer at long sequence lengths:
// RMSNorm (LlamaRMSNorm; Gemma 4's and Qwen3.5's fp32-weight norms; Qwen3.5's gated norm) and RoPE as custom autograd Functions whose forward is the reference op order (bit for
// bit) and whose backward recomputes what the reference graph would have kept. Reference autograd of
// LlamaRMSNorm keeps an fp32 copy of its [T, C] input (2× a bf16 input); RoPE's reference graph
// makes three to four [.., T, D] temporaries in its forward and more in its backward. Used only
// while autograd records (grad mode on and an input requires grad); inference never reaches them.
// Not the attention (nn/attention.h takes SDPA's enable_gqa on the same switch) and not the fused
// inference kernels (nn/fused_ops.h).
#pragma once
#include <ATen/ATen.h>

namespace hearth::nn {

/// Whether the lean Functions (and attention's enable_gqa training path) may run: on unless
/// HEARTH_LEAN_GRAD=0 at start-up, or the last set_lean_grad. Off, autograd records the reference
/// ops as before (for A/B measurements and tests).
bool lean_grad_enabled();
/// Switches the lean path on or off (process-wide; tests and benches); returns the previous setting.
bool set_lean_grad(bool on);

/// True when autograd would record an op on these tensors: grad mode on and one of them (undefined
/// ones skipped) requires grad.
bool records_grad(const at::Tensor& a, const at::Tensor& b = {}, const at::Tensor& c = {});

/// LlamaRMSNorm, weight · (x_f32 · rsqrt(mean(x_f32², -1) + eps)).to(x.dtype), as a custom autograd
/// Function: x [..., C], weight [C] (float dtypes) → [..., C]. The forward runs the reference ops
/// (bit-identical to them); it saves x as it is (no fp32 copy), weight and rstd [..., 1] fp32. The
/// backward recomputes the normalised rows in chunks of about 2^22 elements and returns x's and
/// weight's gradients as autograd of the reference op order gives them, within fp32 rounding (the
/// per-element products that the reference rounds to x's dtype — grad·weight, grad·normed — are
/// rounded the same way). Throws hearth::Error on a shape mismatch.
at::Tensor rms_norm_lean(const at::Tensor& x, const at::Tensor& weight, double eps);

/// The op that forms rstd from ms = mean(x_f32²) + eps: at::rsqrt(ms) (LlamaRMSNorm, Qwen3_5RMSNorm)
/// or at::pow(ms, -0.5) (Gemma4RMSNorm). They may differ in the last bit, so the lean forward takes
/// the op of the module it stands in for.
enum class RstdOp { kRsqrt, kPowMinusHalf };

/// The RMSNorm of Gemma 4 and Qwen3.5, whose weight multiplies in fp32 before the one cast:
/// (x_f32 · rstd · (weight_f32 + offset)).to(x.dtype), rstd = rstd_op(mean(x_f32², -1) + eps), as a
/// custom autograd Function. x [..., C] (float dtype, any strides) and weight [C] (any float dtype;
/// undefined: no weight product, Gemma's v_norm) → [..., C] in x's dtype. offset 0 adds nothing
/// (Gemma4RMSNorm, mlx-converted Qwen3.5); offset 1 is transformers' Qwen3_5RMSNorm
/// (output · (1 + weight.float())). The forward runs the reference ops in their order (bit-identical
/// to Gemma4RMSNorm::forward / ZeroCenteredRMSNorm::forward); it saves x as it is (no fp32 copy),
/// weight and rstd [..., 1] fp32. The backward recomputes the normalised rows in chunks of about
/// 2^22 elements and returns the gradients of x and (when it requires grad) weight as autograd of
/// the reference gives them, within fp32 rounding before their casts to the inputs' dtypes.
/// Throws hearth::Error on a non-float x or a weight that is not [C]. Source: transformers
/// modeling_gemma4.py Gemma4RMSNorm, modeling_qwen3_5.py Qwen3_5RMSNorm.
at::Tensor rms_norm_lean_fp32w(const at::Tensor& x, const at::Tensor& weight, double eps, double offset = 0.0,
                               RstdOp rstd_op = RstdOp::kRsqrt);

/// Qwen3_5RMSNormGated, (weight · (h_f32 · rsqrt(mean(h_f32², -1) + eps)).to(h.dtype)) ·
/// silu(gate_f32), cast to h's dtype, as a custom autograd Function: hidden, gate [..., C] (float
/// dtypes, the same shape), weight [C] → [..., C] in hidden's dtype. The forward runs the reference
/// ops in their order (bit-identical to RMSNormGated::forward); it saves hidden, gate and weight as
/// they are and rstd [..., 1] fp32 (the reference graph keeps fp32 copies of hidden and gate, the
/// fp32 silu, and the normalised and weighted rows). The backward recomputes in chunks of about
/// 2^22 elements: gate's gradient is the reference autograd's bit for bit (the same per-element
/// ops), hidden's and weight's within fp32 rounding before their casts (the products the reference
/// rounds to a dtype are rounded the same way). Throws hearth::Error on mismatched shapes. Source:
/// transformers modeling_qwen3_5.py Qwen3_5RMSNormGated.
at::Tensor rms_norm_gated_lean(const at::Tensor& hidden, const at::Tensor& gate, const at::Tensor& weight, double eps);

/// Whether rotary_lean() applies: lean path on, autograd recording on x (and not on cos/sin), one
/// float dtype for all three, an even last dim equal to cos's and sin's, cos and sin broadcasting to
/// x's shape (the output has x's shape).
bool rotary_lean_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// x·cos + rotate_half(x)·sin (full rotary: cos.size(-1) == x.size(-1)) as a custom autograd
/// Function: bit-identical to the reference ops (each product rounded to the dtype, then the sum;
/// rotate_half's negation exact), with one output and one half-size temporary in the forward and
/// the same in the backward, which applies the inverse rotation: dx = g·cos + rotate_halfᵀ(g·sin),
/// rotate_halfᵀ(u) = [u₂, −u₁] — bit-identical to autograd of the reference for finite values (up
/// to the sign of zeros). Saves only cos and sin. Call it where rotary_lean_applies() holds.
at::Tensor rotary_lean(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace hearth::nn
