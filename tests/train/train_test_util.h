// Helpers shared by the train tests: golden batches, tensor comparisons, a random in-memory
// llama model of any depth. Not a test by itself.
#pragma once
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "adapters/adapter.h"
#include "adapters/mount.h"
#include "io/hf_config.h"
#include "models/registry.h"
#include "nn/param_source.h"
#include "test_paths.h"
#include "train/trainer.h"

namespace hearth::train::testing {

/// Every LoRA A and B tensor of `a` as trainable parameters (layer from the module path; -1 = not in
/// a decoder layer, then part of the head segment).
inline std::vector<TrainableParam> lora_params(const adapters::Adapter& a) {
  std::vector<TrainableParam> out;
  for (const auto& [path, ad] : a.modules) {
    const int64_t layer = adapters::layer_index(path);
    out.push_back({path + ".lora_A", ad.a, layer, false, layer < 0});
    out.push_back({path + ".lora_B", ad.b, layer, false, layer < 0});
  }
  return out;
}

/// Clears the gradients of `ps`.
inline void zero(const std::vector<TrainableParam>& ps) {
  for (const auto& p : ps) p.tensor.mutable_grad() = at::Tensor();
}

inline std::filesystem::path golden(const std::string& rel) {
  return std::filesystem::path(HEARTH_SOURCE_DIR) / "tests/golden" / rel;
}

/// batch.json's input_ids / labels as [B, T] int64.
inline std::pair<at::Tensor, at::Tensor> golden_batch(const std::filesystem::path& batch_json) {
  nlohmann::json j = io::read_json(batch_json);
  auto to_tensor = [](const nlohmann::json& rows) {
    const int64_t B = rows.size(), T = rows[0].size();
    at::Tensor t = at::empty({B, T}, at::kLong);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i) t[b][i] = rows[b][i].get<int64_t>();
    return t;
  };
  return {to_tensor(j["input_ids"]), to_tensor(j["labels"])};
}

/// ‖a − b‖ / ‖b‖ (fp64).
inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return ((x - y).norm() / y.norm().clamp_min(1e-300)).item<double>();
}

/// A llama model with random weights (seeded), L layers, fp32 CPU: C 32, 4 heads (2 KV) of 8,
/// intermediate 64, vocab 97, placed per `where`.
inline std::unique_ptr<models::Model> random_llama(int64_t L, uint64_t seed, nn::LoadOptions where = {}) {
  const int64_t C = 32, H = 4, Hkv = 2, D = 8, I = 64, V = 97;
  nlohmann::json cfg = {{"model_type", "llama"}, {"vocab_size", V}, {"hidden_size", C},
                        {"intermediate_size", I}, {"num_hidden_layers", L}, {"num_attention_heads", H},
                        {"num_key_value_heads", Hkv}, {"head_dim", D}, {"rms_norm_eps", 1e-5},
                        {"max_position_embeddings", 256}, {"rope_theta", 10000.0}};
  at::manual_seed(seed);
  std::map<std::string, at::Tensor> w;
  auto rnd = [](std::vector<int64_t> shape, double s) { return at::randn(shape) * s; };
  w["model.embed_tokens.weight"] = rnd({V, C}, 0.5);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w[p + "input_layernorm.weight"] = 1 + rnd({C}, 0.1);
    w[p + "post_attention_layernorm.weight"] = 1 + rnd({C}, 0.1);
    w[p + "self_attn.q_proj.weight"] = rnd({H * D, C}, 0.2);
    w[p + "self_attn.k_proj.weight"] = rnd({Hkv * D, C}, 0.2);
    w[p + "self_attn.v_proj.weight"] = rnd({Hkv * D, C}, 0.2);
    w[p + "self_attn.o_proj.weight"] = rnd({C, H * D}, 0.2);
    w[p + "mlp.gate_proj.weight"] = rnd({I, C}, 0.2);
    w[p + "mlp.up_proj.weight"] = rnd({I, C}, 0.2);
    w[p + "mlp.down_proj.weight"] = rnd({C, I}, 0.15);
  }
  w["model.norm.weight"] = 1 + rnd({C}, 0.1);
  w["lm_head.weight"] = rnd({V, C}, 0.2);
  nn::TensorMapSource src(std::move(w), "random_llama");
  return models::build_model(models::BuildArgs{cfg, "random_llama", src, std::nullopt, where});
}

}  // namespace hearth::train::testing
