// The gated SiLU MLP of llama-family models: down_proj(silu(gate_proj(x)) * up_proj(x)).
// Not a mixture of experts.
#pragma once
#include <ATen/ATen.h>

#include "nn/linear.h"

namespace hearth::nn {

struct GatedMLP {
  Linear gate_proj, up_proj, down_proj;
  /// x [..., C] → [..., C] (intermediate [..., I]).
  at::Tensor forward(const at::Tensor& x) const {
    return down_proj.forward(at::silu(gate_proj.forward(x)) * up_proj.forward(x));
  }
};

}  // namespace hearth::nn
