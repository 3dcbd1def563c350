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

TEST(LlamaConfig, OutOfRangeValuesAreOneLineNamingTheField) {
  using J = nlohmann::json;
  struct Case {
    J patch;
    std::string expected;  // the whole message
  };
  const std::vector<Case> cases = {
      {{{"rms_norm_eps", 0}}, "m/config.json: 'rms_norm_eps' must be a number > 0, got 0"},
      {{{"rms_norm_eps", -1e-6}}, "m/config.json: 'rms_norm_eps' must be a number > 0, got -1e-06"},
      {{{"rms_norm_eps", "small"}}, "m/config.json: 'rms_norm_eps' must be a number > 0, got \"small\""},
      {{{"rope_theta", 0.0}}, "m/config.json: 'rope_theta' must be > 0, got 0.0"},
      {{{"rope_theta", -10000}}, "m/config.json: 'rope_theta' must be > 0, got -10000"},
      {{{"rope_theta", "x"}}, "m/config.json: 'rope_theta' must be a number, got \"x\""},
      {{{"head_dim", 0}}, "m/config.json: 'head_dim' must be a positive integer, got 0"},
      {{{"head_dim", -8}}, "m/config.json: 'head_dim' must be a positive integer, got -8"},
      {{{"head_dim", 2.5}}, "m/config.json: 'head_dim' must be a positive integer, got 2.5"},
      {{{"head_dim", 7}}, "m/config.json: the rotary dimension (head_dim 7 x partial_rotary_factor 1 = 7) must be positive and even"},
      {{{"num_key_value_heads", -2}}, "m/config.json: 'num_key_value_heads' must be a positive integer, got -2"},
      {{{"max_position_embeddings", 0}}, "m/config.json: 'max_position_embeddings' must be a positive integer, got 0"},
      {{{"partial_rotary_factor", 1.5}}, "m/config.json: 'partial_rotary_factor' must be in (0, 1], got 1.5"},
      {{{"rope_scaling", {{"type", "linear"}, {"factor", "big"}}}}, "m/config.json: rope_scaling: 'factor' must be a number, got \"big\""},
      {{{"rope_scaling", {{"type", "linear"}, {"factor", -2.0}}}},
       "m/config.json: rope_scaling: factor must be >= 1 (linear scaling extends the context), got -2.0"},
      // A yarn factor near 0 made inv_freq infinite and every logit NaN (exit 0).
      {{{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 1e-300}}}},
       "m/config.json: rope_scaling: factor must be >= 1 (yarn scaling extends the context), got 1e-300"},
      {{{"rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 0.5}}}},
       "m/config.json: rope_parameters: factor must be >= 1 (yarn scaling extends the context), got 0.5"},
      // rope_parameters as an array was ignored (default RoPE, silently).
      {{{"rope_parameters", {{{"rope_type", "linear"}, {"factor", 2.0}}}}},
       "m/config.json: rope_parameters must be an object (or null), got array"},
      {{{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", "y"}}}},
       "m/config.json: rope_parameters: 'rope_theta' must be a number, got \"y\""},
      {{{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 64}}}},
       "m/config.json: rope_scaling: needs 0 < low_freq_factor < high_freq_factor, got 4 and 4"},
      {{{"model_type", "qwen2"}, {"use_sliding_window", true}, {"sliding_window", 4}, {"max_window_layers", -3}},
       "m/config.json: 'max_window_layers' must be >= 0, got -3"},
      {{{"tie_word_embeddings", "no"}}, "m/config.json: 'tie_word_embeddings' has the wrong type (\"no\")"},
      // Any other activation ran as silu (the same tokens, exit 0).
      {{{"hidden_act", "gelu"}}, "m/config.json: hidden_act \"gelu\" is not supported (silu only)"},
      {{{"hidden_act", 3}}, "m/config.json: hidden_act 3 is not supported (silu only)"},
  };
  for (const auto& c : cases) {
    const std::string msg = error_of([&] { LlamaConfig::from_json(tiny_llama_config(c.patch), "m/config.json"); });
    EXPECT_EQ(msg, c.expected) << c.patch.dump();
    EXPECT_EQ(msg.find("json.exception"), std::string::npos) << msg;
    // The registry's header-only check (used by `hearth info`) says the same.
    EXPECT_EQ(error_of([&] { hearth::models::check_config(tiny_llama_config(c.patch), "m/config.json"); }), msg);
  }
  EXPECT_EQ(error_of([] { hearth::models::check_config(tiny_llama_config(), "m/config.json"); }), "");
  EXPECT_EQ(error_of([] { hearth::models::check_config(tiny_llama_config({{"model_type", "gpt2"}}), "m/config.json"); }),
            "m/config.json: unsupported model_type 'gpt2' (supported: gemma4, gemma4_text, llama, mistral, qwen2, qwen3, qwen3_5, qwen3_5_text, qwen3_next)");
}

TEST(LlamaConfig, WrongTypedModelTypeSaysItMustBeAString) {
  EXPECT_EQ(error_of([] { hearth::models::check_config(tiny_llama_config({{"model_type", 5}}), "m/config.json"); }),
            "m/config.json: model_type must be a string (e.g. \"llama\"), got number 5");
  EXPECT_EQ(error_of([] { hearth::models::check_config(tiny_llama_config({{"model_type", nullptr}}), "m/config.json"); }),
            "m/config.json: model_type must be a string (e.g. \"llama\"), got null");
  nlohmann::json no_type = tiny_llama_config();
  no_type.erase("model_type");
  const std::string missing = error_of([&] { hearth::models::check_config(no_type, "m/config.json"); });
  EXPECT_EQ(missing.rfind("m/config.json: missing model_type (supported: ", 0), 0u) << missing;
  EXPECT_NE(missing.find("llama, mistral"), std::string::npos) << missing;
}

TEST(LlamaConfig, UnsupportedModelTypeListsSupported) {
  nlohmann::json j = tiny_llama_config({{"model_type", "gpt2"}});
  hearth::nn::TensorMapSource src({});
  auto msg = error_of([&] { hearth::models::build_model({j, "x/config.json", src, std::nullopt, {}}); });
  EXPECT_EQ(msg, "x/config.json: unsupported model_type 'gpt2' (supported: gemma4, gemma4_text, llama, mistral, qwen2, qwen3, qwen3_5, qwen3_5_text, qwen3_next)");
}

TEST(LlamaModel, WrongWeightShapeIsOneLine) {
  auto cfg = LlamaConfig::from_json(tiny_llama_config(), "c");
  auto w = hearth::testing::random_llama_weights(cfg);
  w["model.layers.1.self_attn.k_proj.weight"] = at::zeros({8, 32});
  hearth::nn::TensorMapSource src(w, "model.safetensors");
  EXPECT_EQ(error_of([&] { hearth::models::llama::LlamaModel(cfg, src, std::nullopt, {}); }),
            "model.safetensors: tensor model.layers.1.self_attn.k_proj.weight has shape [8, 32], expected [16, 32]");
}
