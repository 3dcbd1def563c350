// RMSNorm in transformers' op order (LlamaRMSNorm.forward).
#include "nn/rms_norm.h"

namespace hearth::nn {

RMSNorm RMSNorm::load(const ParamSource& src, const std::string& path, int64_t dim, double eps, const LoadOptions& opts) {
  return RMSNorm(place(src.get(path + ".weight", {dim}), opts), eps);
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  const auto input_dtype = x.scalar_type();
  at::Tensor h = x.to(at::kFloat);
  at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps_);
  return weight_ * h.to(input_dtype);
}

}  // namespace hearth::nn
