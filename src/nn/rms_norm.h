// RMSNorm as transformers' LlamaRMSNorm: normalize in fp32, cast back, then scale by the weight.
// Not LayerNorm (no mean subtraction, no bias).
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <utility>

#include "nn/param_source.h"

namespace hearth::nn {

class RMSNorm {
 public:
  RMSNorm() = default;
  RMSNorm(at::Tensor weight, double eps) : weight_(std::move(weight)), eps_(eps) {}
  /// Loads "<path>.weight" [dim].
  static RMSNorm load(const ParamSource& src, const std::string& path, int64_t dim, double eps, const LoadOptions& opts);

  /// x [..., dim] → weight · (x_f32 · rsqrt(mean(x_f32²) + eps)).to(x.dtype), in x's dtype
  /// (weight dtype == x dtype in Hearth's models). While autograd records (x or the weight
  /// requires grad), nn::rms_norm_lean (nn/lean_grad.h): the same values, no fp32 copy of x kept.
  at::Tensor forward(const at::Tensor& x) const;
  /// {x + residual, forward(x + residual)} ([..., dim] each): the residual add and the norm after
  /// it, one fused kernel on CUDA when nn::fused_decode_enabled() (nn/fused_ops.h).
  std::pair<at::Tensor, at::Tensor> forward_add(const at::Tensor& x, const at::Tensor& residual) const;
  const at::Tensor& weight() const { return weight_; }
  double eps() const { return eps_; }

 private:
  at::Tensor weight_;
  double eps_ = 1e-6;
};

}  // namespace hearth::nn
