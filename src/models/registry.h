// model_type → model family factory, and load_model(dir): config.json + weights → a Model.
// Adding a family = one folder under models/ plus one line in registry.cpp's table.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "models/model.h"
#include "nn/quant_config.h"

namespace hearth::models {

/// Everything a family factory gets: the parsed config.json, where it came from, the weights,
/// the MLX quantization block (nullopt for dense checkpoints) and the target placement.
struct BuildArgs {
  const nlohmann::json& config;
  std::string origin;
  const nn::ParamSource& weights;
  std::optional<nn::QuantizationConfig> quantization;
  nn::LoadOptions placement;
};

using Factory = std::function<std::unique_ptr<Model>(const BuildArgs&)>;
/// Validates a family's config.json alone (no weights): throws what its factory would throw.
using ConfigCheck = std::function<void(const nlohmann::json& config, const std::string& origin)>;

/// The model_types Hearth can load, sorted.
std::vector<std::string> supported_model_types();

/// Builds the model for config["model_type"]; throws hearth::Error "<origin>: unsupported
/// model_type 'x' (supported: ...)" for an unknown or missing type.
std::unique_ptr<Model> build_model(const BuildArgs& args);

/// Validates config.json exactly as build_model will (model_type, the family's typed config with
/// its ranges, the quantization block) without weights, for verbs that only read headers
/// (`hearth info`). Throws hearth::Error "<origin>: <field> ..." on the first problem.
void check_config(const nlohmann::json& config, const std::string& origin);

/// Loads `dir` (config.json + safetensors) onto opts.device in opts.dtype.
std::unique_ptr<Model> load_model(const std::filesystem::path& dir, const nn::LoadOptions& opts);

}  // namespace hearth::models
