// Memory-lean autograd for the per-position ops of a training layer at long sequence lengths:
// RMSNorm and RoPE as custom autograd Functions whose forward is the reference op order (bit for
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
