// Inference-time fused ops of the decode path with their tensor-op references: RMSNorm after a
// residual add, and SwiGLU's silu(gate) · up. On CUDA with Hearth's kernels built and the fused
// path switched on (HEARTH_FUSED_DECODE=1, or set_fused_decode) each runs one kernel
// (kernels/norm_act.h); anywhere else, or when autograd needs the graph, the reference ops run.
// Not the modules (nn::RMSNorm, nn::GatedMLP call these) and no backward.
#pragma once
#include <ATen/ATen.h>

#include <utility>

namespace hearth::nn {

/// Whether the fused kernels may run: HEARTH_FUSED_DECODE=1 at start-up (default off: they have
/// not yet been measured against the references on a GPU), or the last set_fused_decode.
bool fused_decode_enabled();
/// Switches the fused path on or off (tests); returns the previous setting.
bool set_fused_decode(bool on);

/// {s, y}: s = x + residual (residual omitted when undefined: s = x), y = weight · RMSNorm(s) in
/// transformers' LlamaRMSNorm op order. x, residual [..., C] and weight [C] of one float dtype.
/// The fused kernel rounds as the reference does except for the sum of squares' order (y within
/// one rounding of the dtype); the reference runs on the CPU, without the kernels, when autograd
/// records (grad mode on and an input requires grad), or when switched off.
std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                               double eps);

/// at::silu(gate) * up ([..., I] each, one float dtype); the fused kernel is bit-identical to it.
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up);

}  // namespace hearth::nn
