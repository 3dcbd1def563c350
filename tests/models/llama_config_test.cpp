// LlamaConfig parsing per model_type (defaults as in transformers' config classes), errors that
// name the key, and the registry's unsupported model_type error.
#include "models/llama/config.h"

#include <gtest/gtest.h>

#include "../test_util.h"

#include "core/error.h"
#include "models/registry.h"
#include "nn/param_source.h"
#include "random_llama.h"

using hearth::models::llama::LlamaConfig;
using hearth::testing::tiny_llama_config;

using hearth::testing::error_of;

TEST(LlamaConfig, LlamaDefaults) {
  auto j = tiny_llama_config();
  j.erase("num_key_value_heads");
  auto c = LlamaConfig::from_json(j, "config.json");
  EXPECT_EQ(c.num_key_value_heads, 4);  // defaults to num_attention_heads
  EXPECT_EQ(c.head_dim, 8);             // hidden / heads
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.layer_windows[0].has_value());
  auto b = LlamaConfig::from_json(tiny_llama_config({{"attention_bias", true}, {"mlp_bias", true}, {"head_dim", 16}}), "c");
  EXPECT_TRUE(b.qkv_bias && b.o_bias && b.mlp_bias);
  EXPECT_EQ(b.head_dim, 16);
}

TEST(LlamaConfig, Qwen2Qwen3Mistral) {
  auto q2 = LlamaConfig::from_json(tiny_llama_config({{"model_type", "qwen2"}}), "c");
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.o_bias);  // Qwen2Attention: o_proj has no bias
  auto q3 = LlamaConfig::from_json(tiny_llama_config({{"model_type", "qwen3"}}), "c");
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.qkv_bias);
  // qwen2 sliding window: only with use_sliding_window, on layers >= max_window_layers.
  auto q2w = LlamaConfig::from_json(
      tiny_llama_config({{"model_type", "qwen2"}, {"use_sliding_window", true}, {"sliding_window", 7}, {"max_window_layers", 1}}),
      "c");
  EXPECT_FALSE(q2w.layer_windows[0].has_value());
  EXPECT_EQ(q2w.layer_windows[1].value_or(0), 7);
  auto q2off = LlamaConfig::from_json(tiny_llama_config({{"model_type", "qwen2"}, {"sliding_window", 7}}), "c");
  EXPECT_FALSE(q2off.layer_windows[1].has_value());
  // mistral: every layer; the default window is 4096 when the key is absent, none when null.
  auto m = LlamaConfig::from_json(tiny_llama_config({{"model_type", "mistral"}}), "c");
  EXPECT_EQ(m.layer_windows[0].value_or(0), 4096);
  auto mn = LlamaConfig::from_json(tiny_llama_config({{"model_type", "mistral"}, {"sliding_window", nullptr}}), "c");
  EXPECT_FALSE(mn.layer_windows[0].has_value());
}

TEST(LlamaConfig, RopeBothConventions) {
  auto v4 = LlamaConfig::from_json(
      tiny_llama_config({{"rope_theta", 1e6}, {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}), "c");
  auto j5 = tiny_llama_config({{"rope_parameters", {{"rope_type", "linear"}, {"rope_theta", 1e6}, {"factor", 2.0}}}});
  j5.erase("rope_theta");
  auto v5 = LlamaConfig::from_json(j5, "c");
  EXPECT_EQ(v4.rope.type, "linear");
  EXPECT_EQ(v5.rope.type, "linear");
  EXPECT_EQ(v4.rope.theta, 1e6);
  EXPECT_EQ(v5.rope.theta, 1e6);
  EXPECT_EQ(v5.rope.factor, 2.0);
}

TEST(LlamaConfig, MissingKeyIsNamed) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
    auto j = tiny_llama_config();
    j.erase(key);
    EXPECT_EQ(error_of([&] { LlamaConfig::from_json(j, "m/config.json"); }),
              std::string("m/config.json: missing required key '") + key + "'");
  }
  EXPECT_NE(error_of([] { LlamaConfig::from_json(tiny_llama_config({{"num_key_value_heads", 3}}), "c"); })
                .find("multiple of num_key_value_heads"),
            std::string::npos);
}

TEST(LlamaConfig, UnsupportedModelTypeListsSupported) {
  nlohmann::json j = tiny_llama_config({{"model_type", "gpt2"}});
  hearth::nn::TensorMapSource src({});
  auto msg = error_of([&] { hearth::models::build_model({j, "x/config.json", src, std::nullopt, {}}); });
  EXPECT_EQ(msg, "x/config.json: unsupported model_type 'gpt2' (supported: llama, mistral, qwen2, qwen3)");
}

TEST(LlamaModel, WrongWeightShapeIsOneLine) {
  auto cfg = LlamaConfig::from_json(tiny_llama_config(), "c");
  auto w = hearth::testing::random_llama_weights(cfg);
  w["model.layers.1.self_attn.k_proj.weight"] = at::zeros({8, 32});
  hearth::nn::TensorMapSource src(w, "model.safetensors");
  EXPECT_EQ(error_of([&] { hearth::models::llama::LlamaModel(cfg, src, std::nullopt, {}); }),
            "model.safetensors: tensor model.layers.1.self_attn.k_proj.weight has shape [8, 32], expected [16, 32]");
}
