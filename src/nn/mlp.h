// The gated SiLU MLP of llama-family models: down_proj(silu(gate_proj(x)) * up_proj(x)), run over
// chunks of positions when an MlpChunkScope asks for it (nn/mlp_chunk.h). Not a mixture of experts.
#pragma once
#include <ATen/ATen.h>

#include <utility>

#include "nn/linear.h"

namespace hearth::nn {

struct GatedMLP {
  Linear gate_proj, up_proj, down_proj;
  /// x [..., C] → [..., C] (intermediate [..., I]). Inside an MlpChunkScope (nn/mlp_chunk.h) of N
  /// positions, an x of more than N positions runs N at a time (with grad: a chunked checkpoint that
  /// saves only x); same values as forward_whole. Throws what Linear::forward throws.
  at::Tensor forward(const at::Tensor& x) const;
  /// {sum, forward(norm(sum))} for an input still to be normalised (Linear::NormedInput, sum = x +
  /// residual): on the decode path the norm may run inside the gate/up GEMV launch
  /// (Linear::forward_many_normed: small MLPs only, nn::kGemvNormMaxRows); inside an MlpChunkScope the norm runs first and
  /// forward() chunks as usual. Throws what the norm and forward throw.
  std::pair<at::Tensor, at::Tensor> forward_normed(const Linear::NormedInput& in) const;
  /// The whole formula at once (every intermediate saved by autograd when grad is on).
  at::Tensor forward_whole(const at::Tensor& x) const;
};

}  // namespace hearth::nn
