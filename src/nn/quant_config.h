// The MLX `quantization` block of a model's config.json (mlx-lm's per-module group size and bits):
// parsed once at load, asked per module by the loaders and by convert/fuse. Not the quantized
// tensors themselves (nn/quant.h).
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>

#include "nn/quant.h"

namespace hearth::nn {

/// MLX quantization block: config.json "quantization" (or "quantization_config" with the same
/// shape): {"group_size": 64, "bits": 4, "<module path>": {"group_size":..,"bits":..} | false}.
struct QuantizationConfig {
  QuantSpec default_spec;
  /// Per-module overrides by module path ("model.layers.0.mlp.down_proj"); nullopt = not quantized.
  std::map<std::string, std::optional<QuantSpec>> overrides;
  /// The spec for module `path`: its override, else the default. An override keyed with another
  /// prefix than the model's module path (mlx-vlm's "language_model.model.layers.0.mlp.gate_proj"
  /// for "model.layers.0.mlp.gate_proj", or the reverse) applies when it is the only key that
  /// equals `path` after dropping whole leading components from one of the two; two such keys with
  /// different specs throw hearth::Error naming both (mlx-lm's class_predicate looks keys up by the
  /// module's own path; this extends it to wrapped and unwrapped checkpoints).
  std::optional<QuantSpec> spec_for(const std::string& path) const;
  /// nullopt when config.json has no quantization block. Throws on bad bits/group sizes.
  static std::optional<QuantizationConfig> from_config(const nlohmann::json& config, const std::string& origin);
  nlohmann::json to_json() const;
};

}  // namespace hearth::nn
