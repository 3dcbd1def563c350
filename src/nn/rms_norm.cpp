// RMSNorm in transformers' op order (LlamaRMSNorm.forward).
#include "nn/rms_norm.h"

#include "nn/fused_ops.h"

namespace hearth::nn {

RMSNorm RMSNorm::load(const ParamSource& src, const std::string& path, int64_t dim, double eps, const LoadOptions& opts) {
  return RMSNorm(place(src.get(path + ".weight", {dim}), opts), eps);
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const { return add_rms_norm(x, at::Tensor(), weight_, eps_).second; }

std::pair<at::Tensor, at::Tensor> RMSNorm::forward_add(const at::Tensor& x, const at::Tensor& residual) const {
  return add_rms_norm(x, residual, weight_, eps_);
}

}  // namespace hearth::nn
