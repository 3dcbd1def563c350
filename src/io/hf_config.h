// Hugging Face folder-level JSON that is not model-family specific: reading JSON files with
// clear errors, generation_config.json, and the MLX `quantization` block of config.json.
// Family configs (hidden sizes, RoPE, ...) live with their family under models/.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nn/quant.h"

namespace hearth::io {

/// Parses a JSON file; throws hearth::Error "<path>: invalid JSON (...)" / "<path>: cannot read".
nlohmann::json read_json(const std::filesystem::path& path);

/// generation_config.json (all fields optional; a missing file gives an empty config).
struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;   // eos_token_id: int or list
  std::optional<int64_t> bos_token_id;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
  std::optional<bool> do_sample;
  static GenerationConfig load(const std::filesystem::path& dir);
};

/// MLX quantization block: config.json "quantization" (or "quantization_config" with the same
/// shape): {"group_size": 64, "bits": 4, "<module path>": {"group_size":..,"bits":..} | false}.
struct QuantizationConfig {
  nn::QuantSpec default_spec;
  /// Per-module overrides by module path ("model.layers.0.mlp.down_proj"); nullopt = not quantized.
  std::map<std::string, std::optional<nn::QuantSpec>> overrides;
  /// The spec for module `path` (override, else default).
  std::optional<nn::QuantSpec> spec_for(const std::string& path) const;
  /// nullopt when config.json has no quantization block. Throws on bad bits/group sizes.
  static std::optional<QuantizationConfig> from_config(const nlohmann::json& config, const std::string& origin);
  nlohmann::json to_json() const;
};

}  // namespace hearth::io
