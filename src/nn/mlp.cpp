// GatedMLP's forward: whole, or over chunks of positions inside an MlpChunkScope (nn/mlp_chunk.h).
#include "nn/mlp.h"

#include "nn/fused_ops.h"
#include "nn/mlp_chunk.h"

namespace hearth::nn {

at::Tensor GatedMLP::forward_whole(const at::Tensor& x) const {
  const std::vector<at::Tensor> gu = Linear::forward_many(x, {&gate_proj, &up_proj});
  return down_proj.forward(silu_mul(gu[0], gu[1]));
}

std::pair<at::Tensor, at::Tensor> GatedMLP::forward_normed(const Linear::NormedInput& in) const {
  if (MlpChunkScope::current() > 0) {
    auto [sum, normed] = in.residual.defined() ? in.norm->forward_add(in.x, in.residual)
                                               : std::pair<at::Tensor, at::Tensor>{in.x, in.norm->forward(in.x)};
    return {sum, forward(normed)};
  }
  Linear::NormedProducts p = Linear::forward_many_normed(in, {&gate_proj, &up_proj});
  return {p.sum, down_proj.forward(silu_mul(p.ys[0], p.ys[1]))};
}

at::Tensor GatedMLP::forward(const at::Tensor& x) const {
  if (MlpChunkScope::current() <= 0) return forward_whole(x);
  return position_wise_chunked(x, [this](const at::Tensor& c) { return forward_whole(c); },
                               {&gate_proj, &up_proj, &down_proj});
}

}  // namespace hearth::nn
