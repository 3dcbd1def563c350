// Test helper: a llama-family model with random weights built in memory (no files), from a
// config.json-like object. Not a golden: parity against transformers lives in llama_parity_test.
#pragma once
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>

#include "models/llama/llama.h"
#include "nn/param_source.h"

namespace hearth::testing {

/// A small llama config (2 layers, C=32, 4 heads, 2 KV heads, V=64); `patch` overrides keys.
inline nlohmann::json tiny_llama_config(const nlohmann::json& patch = nlohmann::json::object()) {
  nlohmann::json c = {{"model_type", "llama"},      {"vocab_size", 64},         {"hidden_size", 32},
                      {"intermediate_size", 48},    {"num_hidden_layers", 2},   {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},   {"rms_norm_eps", 1e-5},     {"max_position_embeddings", 128},
                      {"rope_theta", 10000.0},      {"tie_word_embeddings", false}};
  c.update(patch);
  return c;
}

/// Random weights (normal · 0.2, norms around 1) with HF names for `config`.
inline std::map<std::string, at::Tensor> random_llama_weights(const models::llama::LlamaConfig& c, uint64_t seed = 0) {
  at::manual_seed(seed);
  std::map<std::string, at::Tensor> w;
  auto rnd = [](std::vector<int64_t> shape) { return at::randn(shape) * 0.2; };
  auto norm = [](int64_t n) { return 1.0 + at::randn({n}) * 0.1; };
  const int64_t C = c.hidden_size, D = c.head_dim, H = c.num_attention_heads, Hkv = c.num_key_value_heads,
                I = c.intermediate_size;
  w["model.embed_tokens.weight"] = rnd({c.vocab_size, C});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    w[p + "input_layernorm.weight"] = norm(C);
    w[p + "post_attention_layernorm.weight"] = norm(C);
    w[p + "self_attn.q_proj.weight"] = rnd({H * D, C});
    w[p + "self_attn.k_proj.weight"] = rnd({Hkv * D, C});
    w[p + "self_attn.v_proj.weight"] = rnd({Hkv * D, C});
    w[p + "self_attn.o_proj.weight"] = rnd({C, H * D});
    if (c.qkv_bias) {
      w[p + "self_attn.q_proj.bias"] = rnd({H * D});
      w[p + "self_attn.k_proj.bias"] = rnd({Hkv * D});
      w[p + "self_attn.v_proj.bias"] = rnd({Hkv * D});
    }
    if (c.o_bias) w[p + "self_attn.o_proj.bias"] = rnd({C});
    if (c.qk_norm) {
      w[p + "self_attn.q_norm.weight"] = norm(D);
      w[p + "self_attn.k_norm.weight"] = norm(D);
    }
    w[p + "mlp.gate_proj.weight"] = rnd({I, C});
    w[p + "mlp.up_proj.weight"] = rnd({I, C});
    w[p + "mlp.down_proj.weight"] = rnd({C, I});
    if (c.mlp_bias) {
      w[p + "mlp.gate_proj.bias"] = rnd({I});
      w[p + "mlp.up_proj.bias"] = rnd({I});
      w[p + "mlp.down_proj.bias"] = rnd({C});
    }
  }
  w["model.norm.weight"] = norm(C);
  if (!c.tie_word_embeddings) w["lm_head.weight"] = rnd({c.vocab_size, C});
  return w;
}

/// A random model for `config_json` on CPU in `dtype`.
inline std::unique_ptr<models::llama::LlamaModel> random_llama(const nlohmann::json& config_json,
                                                               at::ScalarType dtype = at::kFloat, uint64_t seed = 0) {
  auto cfg = models::llama::LlamaConfig::from_json(config_json, "config.json");
  nn::TensorMapSource src(random_llama_weights(cfg, seed));
  return std::make_unique<models::llama::LlamaModel>(cfg, src, std::nullopt, nn::LoadOptions{at::kCPU, dtype});
}

}  // namespace hearth::testing
