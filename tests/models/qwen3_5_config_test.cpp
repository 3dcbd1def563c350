// Qwen3_5Config parsing (qwen3_5 wrapper, qwen3_5_text, qwen3_next; layer kinds from layer_types
// or the interval rule; transformers' defaults) and its one-line errors naming file and field;
// weight-layout errors (conv1d shape, missing layers / lm_head) through the registry.
#include "models/qwen3_5/config.h"

#include <gtest/gtest.h>

#include "../test_util.h"

#include "core/error.h"
#include "models/qwen3_5/qwen3_5.h"
#include "models/registry.h"
#include "nn/param_source.h"

using hearth::models::qwen3_5::LayerKind;
using hearth::models::qwen3_5::Qwen3_5Config;
using hearth::testing::error_of;
using nlohmann::json;

namespace {

json text_cfg(json over = json::object()) {
  json j = {{"model_type", "qwen3_5_text"}, {"vocab_size", 97}, {"hidden_size", 32}, {"intermediate_size", 64},
            {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 8},
            {"linear_num_key_heads", 2}, {"linear_num_value_heads", 4}, {"linear_key_head_dim", 8},
            {"linear_value_head_dim", 8}, {"linear_conv_kernel_dim", 4}, {"rms_norm_eps", 1e-6},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}}}};
  for (auto& [k, v] : over.items()) {
    if (v.is_null()) j.erase(k);
    else j[k] = v;
  }
  return j;
}

std::string err(const json& j) {
  return error_of([&] { Qwen3_5Config::from_json(j, "config.json"); });
}

}  // namespace

TEST(Qwen3_5Config, IntervalRuleAndDefaults) {
  auto c = Qwen3_5Config::from_json(text_cfg(), "config.json");
  ASSERT_EQ(c.layer_types.size(), 4u);  // interval 4: linear, linear, linear, full
  EXPECT_EQ(c.layer_types[0], LayerKind::kLinear);
  EXPECT_EQ(c.layer_types[2], LayerKind::kLinear);
  EXPECT_EQ(c.layer_types[3], LayerKind::kFull);
  EXPECT_EQ(c.conv_dim(), 2 * 2 * 8 + 4 * 8);
  EXPECT_EQ(c.rotary_dim(), 4);
  auto d = Qwen3_5Config::from_json(text_cfg({{"full_attention_interval", 2}, {"head_dim", nullptr},
                                              {"rope_parameters", nullptr}}),
                                    "config.json");
  EXPECT_EQ(d.layer_types[1], LayerKind::kFull);
  EXPECT_EQ(d.layer_types[2], LayerKind::kLinear);
  EXPECT_EQ(d.head_dim, 256);                          // Qwen3_5TextConfig's default, not hidden / heads
  EXPECT_DOUBLE_EQ(d.rope.partial_rotary_factor, 0.25);  // assigned when the config names none
  EXPECT_EQ(d.rotary_dim(), 64);
}

TEST(Qwen3_5Config, LayerTypesWinOverInterval) {
  auto c = Qwen3_5Config::from_json(
      text_cfg({{"full_attention_interval", 2},
                {"layer_types", {"full_attention", "linear_attention", "linear_attention", "linear_attention"}}}),
      "config.json");
  EXPECT_EQ(c.layer_types[0], LayerKind::kFull);
  EXPECT_EQ(c.layer_types[1], LayerKind::kLinear);
  EXPECT_EQ(c.layer_types[3], LayerKind::kLinear);
}

TEST(Qwen3_5Config, WrapperReadsTextConfig) {
  json top = {{"model_type", "qwen3_5"}, {"text_config", text_cfg({{"eos_token_id", json::array({5, 7})}})},
              {"vision_config", {{"depth", 2}}}, {"tie_word_embeddings", true}};
  auto c = Qwen3_5Config::from_json(top, "config.json");
  EXPECT_EQ(c.model_type, "qwen3_5");
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{5, 7}));
  top["text_config"]["tie_word_embeddings"] = false;  // the text config's own flag wins
  EXPECT_FALSE(Qwen3_5Config::from_json(top, "config.json").tie_word_embeddings);
  top["text_config"]["num_attention_heads"] = "four";
  EXPECT_EQ(error_of([&] { Qwen3_5Config::from_json(top, "config.json"); }),
            "config.json: text_config: 'num_attention_heads' must be a positive integer, got \"four\"");
  EXPECT_EQ(error_of([&] { Qwen3_5Config::from_json({{"model_type", "qwen3_5"}}, "config.json"); }),
            "config.json: model_type qwen3_5 needs a 'text_config' object");
}

TEST(Qwen3_5Config, ErrorsNameFileAndField) {
  EXPECT_EQ(err(text_cfg({{"layer_types", {"linear_attention", "full_attention"}}})),
            "config.json: layer_types has 2 entries for num_hidden_layers = 4");
  EXPECT_EQ(err(text_cfg({{"layer_types", {"linear_attention", "full_attention", "sliding", "full_attention"}}})),
            "config.json: layer_types[2] 'sliding' is not linear_attention or full_attention");
  EXPECT_EQ(err(text_cfg({{"num_key_value_heads", 3}})),
            "config.json: num_attention_heads (4) must be a multiple of num_key_value_heads (3)");
  EXPECT_EQ(err(text_cfg({{"linear_num_value_heads", 3}})),
            "config.json: linear_num_value_heads (3) must be a multiple of linear_num_key_heads (2)");
  EXPECT_EQ(err(text_cfg({{"hidden_size", nullptr}})), "config.json: missing required key 'hidden_size'");
  EXPECT_EQ(err(text_cfg({{"linear_num_key_heads", nullptr}})),
            "config.json: missing required key 'linear_num_key_heads'");
  EXPECT_EQ(err(text_cfg({{"hidden_act", "gelu"}})), "config.json: hidden_act \"gelu\" is not supported (silu only)");
  EXPECT_EQ(err(text_cfg({{"rope_parameters", {{"rope_type", "default"}, {"partial_rotary_factor", 0.1}}}})),
            "config.json: the rotary dimension (head_dim 8 x partial_rotary_factor 0.1 = 0) must be positive and even");
  EXPECT_NE(err(text_cfg({{"model_type", "llama"}})).find("not a Qwen3.5-family type"), std::string::npos);
  // Every error is one line.
  EXPECT_EQ(err(text_cfg({{"num_hidden_layers", 0}})).find('\n'), std::string::npos);
}

TEST(Qwen3_5Config, Qwen3NextDenseOnly) {
  // transformers' Qwen3NextConfig defaults num_experts to 512: a config without it is MoE.
  std::string e = err(text_cfg({{"model_type", "qwen3_next"}}));
  EXPECT_NE(e.find("config.json: num_experts = 512 (the transformers default; layer 0"), std::string::npos) << e;
  EXPECT_NE(e.find("only the dense-MLP variant is supported"), std::string::npos) << e;
  EXPECT_EQ(err(text_cfg({{"model_type", "qwen3_next"}, {"num_experts", 8}, {"decoder_sparse_step", 2}})),
            "config.json: num_experts = 8 (layer 1 would be a mixture of experts): only the dense-MLP variant is "
            "supported");
  EXPECT_EQ(err(text_cfg({{"model_type", "qwen3_next"}, {"num_experts", 0}})), "");
  EXPECT_EQ(err(text_cfg({{"model_type", "qwen3_next"}, {"num_experts", 4}, {"mlp_only_layers", {0, 1, 2, 3}}})), "");
  EXPECT_NE(err(text_cfg({{"num_experts", 4}})).find("num_experts = 4"), std::string::npos);  // qwen3_5 MoE
}

namespace {

// Random dense weights for text_cfg() (interval rule: layers 0-2 linear, 3 full), HF layout.
std::map<std::string, at::Tensor> random_weights(const Qwen3_5Config& c, bool tied) {
  std::map<std::string, at::Tensor> w;
  auto r = [](std::vector<int64_t> s) { return at::randn(s) * 0.2; };
  const int64_t C = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  w["model.embed_tokens.weight"] = r({c.vocab_size, C});
  w["model.norm.weight"] = r({C});
  if (!tied) w["lm_head.weight"] = r({c.vocab_size, C});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    w[p + "input_layernorm.weight"] = r({C});
    w[p + "post_attention_layernorm.weight"] = r({C});
    w[p + "mlp.gate_proj.weight"] = r({I, C});
    w[p + "mlp.up_proj.weight"] = r({I, C});
    w[p + "mlp.down_proj.weight"] = r({C, I});
    if (c.layer_types[i] == LayerKind::kFull) {
      w[p + "self_attn.q_proj.weight"] = r({c.num_attention_heads * D * 2, C});
      w[p + "self_attn.k_proj.weight"] = r({c.num_key_value_heads * D, C});
      w[p + "self_attn.v_proj.weight"] = r({c.num_key_value_heads * D, C});
      w[p + "self_attn.o_proj.weight"] = r({C, c.num_attention_heads * D});
      w[p + "self_attn.q_norm.weight"] = r({D});
      w[p + "self_attn.k_norm.weight"] = r({D});
    } else {
      const std::string q = p + "linear_attn.";
      w[q + "in_proj_qkv.weight"] = r({c.conv_dim(), C});
      w[q + "in_proj_z.weight"] = r({c.value_dim(), C});
      w[q + "in_proj_b.weight"] = r({c.linear_num_value_heads, C});
      w[q + "in_proj_a.weight"] = r({c.linear_num_value_heads, C});
      w[q + "out_proj.weight"] = r({C, c.value_dim()});
      w[q + "conv1d.weight"] = r({c.conv_dim(), 1, c.linear_conv_kernel_dim});
      w[q + "A_log"] = r({c.linear_num_value_heads});
      w[q + "dt_bias"] = r({c.linear_num_value_heads});
      w[q + "norm.weight"] = r({c.linear_value_head_dim});
    }
  }
  return w;
}

std::string build_error(const json& cfg, std::map<std::string, at::Tensor> w) {
  hearth::nn::TensorMapSource src(std::move(w), "model.safetensors");
  return error_of([&] { hearth::models::build_model({cfg, "config.json", src, std::nullopt, {}}); });
}

}  // namespace

TEST(Qwen3_5Config, WeightLayoutErrors) {
  const json cfg = text_cfg();
  const auto c = Qwen3_5Config::from_json(cfg, "config.json");
  EXPECT_EQ(build_error(cfg, random_weights(c, false)), "");
  auto bad = random_weights(c, false);
  bad["model.layers.1.linear_attn.conv1d.weight"] = at::zeros({c.conv_dim(), 2, 4});
  EXPECT_EQ(build_error(cfg, bad),
            "config.json: linear_conv_kernel_dim = 4 and conv dim 64, but model.layers.1.linear_attn.conv1d.weight "
            "has shape [64, 2, 4] (expected [64, 1, 4] or [64, 4, 1])");
  EXPECT_EQ(build_error(cfg, random_weights(c, true)),
            "config.json: tie_word_embeddings is false, but the weights have no lm_head.weight");
  EXPECT_EQ(build_error(text_cfg({{"num_hidden_layers", 3}, {"layer_types", {"linear_attention", "linear_attention",
                                                                             "full_attention"}}}),
                        random_weights(c, false)),
            "config.json: num_hidden_layers = 3, but the weights have more layers");
  EXPECT_NE(build_error(cfg, {}).find("config.json: the weights have no embed_tokens.weight"), std::string::npos);
}

TEST(Qwen3_5Config, RegistryKnowsTheFamily) {
  auto types = hearth::models::supported_model_types();
  for (const char* t : {"qwen3_5", "qwen3_5_text", "qwen3_next"})
    EXPECT_NE(std::find(types.begin(), types.end(), t), types.end()) << t;
  EXPECT_NO_THROW(hearth::models::check_config(text_cfg(), "config.json"));
  EXPECT_EQ(error_of([&] { hearth::models::check_config(text_cfg({{"num_key_value_heads", 3}}), "config.json"); }),
            "config.json: num_attention_heads (4) must be a multiple of num_key_value_heads (3)");
}
