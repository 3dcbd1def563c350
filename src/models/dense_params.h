// The one rule by which families list a Linear's weights for a full fine-tune. Not LoRA (adapters/)
// and not loading (nn/linear.h).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "nn/linear.h"

namespace hearth::models {

/// Appends `<path>.weight` (and `<path>.bias` when present) of `lin` to `out`, the model's own
/// tensors. Throws hearth::Error naming `path` when the weight is quantized (full fine-tuning needs
/// dense weights; LoRA works on quantized ones).
inline void append_dense(std::vector<std::pair<std::string, at::Tensor>>& out, const std::string& path,
                         const nn::Linear& lin) {
  HEARTH_CHECK(!lin.quantized(), path, ": quantized weights cannot be fully fine-tuned (use LoRA)");
  out.emplace_back(path + ".weight", lin.weight());
  if (lin.bias()) out.emplace_back(path + ".bias", *lin.bias());
}

}  // namespace hearth::models
