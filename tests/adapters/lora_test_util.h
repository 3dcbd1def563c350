// Helpers for adapter tests: golden paths (PEFT 0.21 adapters made by tools/gen_lora_goldens.py on
// the tiny transformers models), the golden batch, a token-mean CE over labels as transformers
// computes it, and merging an adapter into a model's dense weights. Not library code.
#pragma once
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "../io/io_test_util.h"
#include "../test_util.h"  // CliResult, run_hearth
#include "core/error.h"
#include "adapters/adapter.h"
#include "adapters/mount.h"
#include "io/hf_config.h"
#include "models/registry.h"
#include "test_paths.h"

namespace hearth::testing {

inline std::filesystem::path golden_model(const std::string& variant) {
  return std::filesystem::path(HEARTH_SOURCE_DIR) / "tests/golden/models" / variant;
}
inline std::filesystem::path golden_lora(const std::string& variant) {
  return std::filesystem::path(HEARTH_SOURCE_DIR) / "tests/golden/lora" / variant;
}

inline std::unique_ptr<models::Model> load_tiny(const std::string& variant) {
  return models::load_model(golden_model(variant), {at::kCPU, at::kFloat});
}

/// The golden batch: input_ids [B, T] int64, labels [B, T] (-100 = unsupervised), PEFT's loss.
struct GoldenBatch {
  at::Tensor ids, labels;
  double loss = 0.0;
};
inline GoldenBatch golden_batch(const std::string& variant) {
  auto j = io::read_json(golden_lora(variant) / "batch.json");
  auto to_tensor = [](const nlohmann::json& rows) {
    std::vector<int64_t> flat;
    for (const auto& r : rows)
      for (const auto& v : r) flat.push_back(v.get<int64_t>());
    return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), -1});
  };
  return {to_tensor(j["input_ids"]), to_tensor(j["labels"]), j["loss"].get<double>()};
}

/// transformers' causal-LM loss: mean CE of logits[:, :-1] against labels[:, 1:], ignoring -100.
inline at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t V = logits.size(-1);
  at::Tensor l = logits.narrow(1, 0, logits.size(1) - 1).reshape({-1, V});
  at::Tensor t = labels.narrow(1, 1, labels.size(1) - 1).reshape({-1});
  return at::cross_entropy_loss(l, t, {}, at::Reduction::Mean, -100);
}

/// Adds scale · B A to the dense weights of `model` in place (the reference for a mounted adapter).
inline void merge_into(models::Model& model, const adapters::Adapter& ad) {
  c10::NoGradGuard g;
  for (auto& [path, lin] : model.linear_modules()) {
    auto it = ad.modules.find(path);
    if (it == ad.modules.end()) continue;
    lin->weight().add_(at::mm(it->second.b.to(at::kFloat), it->second.a.to(at::kFloat)) * it->second.scale);
  }
}

inline at::Tensor logits_of(models::Model& m, const at::Tensor& ids) {
  c10::NoGradGuard g;
  return m.forward(ids, 0, nullptr);
}

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace hearth::testing
