// The gated SiLU MLP of llama-family models: down_proj(silu(gate_proj(x)) * up_proj(x)), run over
// chunks of positions when an MlpChunkScope asks for it (nn/mlp_chunk.h). Not a mixture of experts.
#pragma once
#include <ATen/ATen.h>

#include "nn/linear.h"

namespace hearth::nn {

struct GatedMLP {
  Linear gate_proj, up_proj, down_proj;
  /// x [..., C] → [..., C] (intermediate [..., I]). Inside an MlpChunkScope (nn/mlp_chunk.h) of N
  /// positions, an x of more than N positions runs N at a time (with grad: a chunked checkpoint that
  /// saves only x); same values as forward_whole. Throws what Linear::forward throws.
  at::Tensor forward(const at::Tensor& x) const;
  /// The whole formula at once (every intermediate saved by autograd when grad is on).
  at::Tensor forward_whole(const at::Tensor& x) const;
};

}  // namespace hearth::nn
