// nn/quant_config: the MLX quantization block of config.json — defaults, per-module overrides
// (across wrapped and unwrapped prefixes), the quantization_config key, bad bits/group/mode.
#include <gtest/gtest.h>

#include "core/error.h"
#include "nn/quant_config.h"
#include "test_util.h"

using hearth::nn::QuantizationConfig;
using hearth::testing::error_of;
using nlohmann::json;

TEST(QuantizationConfig, AbsentGivesNullopt) {
  EXPECT_FALSE(QuantizationConfig::from_config(json{{"hidden_size", 8}}, "config.json").has_value());
}

TEST(QuantizationConfig, DefaultsAndOverrides) {
  json c = json::parse(R"({"quantization": {"group_size": 64, "bits": 4, "mode": "affine",
      "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
      "model.embed_tokens": false}})");
  auto q = QuantizationConfig::from_config(c, "config.json");
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->default_spec, (hearth::nn::QuantSpec{4, 64}));
  EXPECT_EQ(q->spec_for("model.layers.0.mlp.down_proj"), (hearth::nn::QuantSpec{8, 32}));
  EXPECT_EQ(q->spec_for("model.layers.1.mlp.down_proj"), (hearth::nn::QuantSpec{4, 64}));
  EXPECT_FALSE(q->spec_for("model.embed_tokens").has_value());
  EXPECT_EQ(q->overrides.size(), 2u);
  auto back = QuantizationConfig::from_config(json{{"quantization", q->to_json()}}, "x");
  EXPECT_EQ(back->overrides, q->overrides);
  EXPECT_EQ(back->default_spec, q->default_spec);
}

// mlx-vlm writes overrides under the wrapper's path ("language_model.model.layers.0...") while the
// weights (and Hearth's modules) are "model.layers.0..."; the reverse happens too. An override whose
// key differs from the module path only by whole leading components applies when unambiguous.
TEST(QuantizationConfig, OverridesMatchAcrossPrefixes) {
  json c = json::parse(R"({"quantization": {"group_size": 64, "bits": 4,
      "language_model.model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
      "language_model.lm_head": false,
      "layers.1.self_attn.q_proj": {"bits": 6}}})");
  auto q = QuantizationConfig::from_config(c, "config.json");
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->spec_for("model.layers.0.mlp.down_proj"), (hearth::nn::QuantSpec{8, 32}));
  EXPECT_FALSE(q->spec_for("lm_head").has_value());
  EXPECT_EQ(q->spec_for("model.layers.1.self_attn.q_proj"), (hearth::nn::QuantSpec{6, 64}));
  // Whole components only: layers.10 is not layers.0, "xmodel" is not "model".
  EXPECT_EQ(q->spec_for("model.layers.10.mlp.down_proj"), (hearth::nn::QuantSpec{4, 64}));
  EXPECT_EQ(q->spec_for("model.layers.1.self_attn.xq_proj"), (hearth::nn::QuantSpec{4, 64}));
  EXPECT_EQ(q->spec_for("model.layers.0.mlp.up_proj"), (hearth::nn::QuantSpec{4, 64}));
  // Two candidate keys with different settings: refused, naming both.
  json amb = json::parse(R"({"quantization": {"group_size": 64, "bits": 4,
      "language_model.model.layers.0.mlp.down_proj": {"bits": 8},
      "vision_tower.model.layers.0.mlp.down_proj": {"bits": 2}}})");
  auto qa = QuantizationConfig::from_config(amb, "config.json");
  const std::string msg = error_of([&] { qa->spec_for("model.layers.0.mlp.down_proj"); });
  EXPECT_NE(msg.find("model.layers.0.mlp.down_proj matches two overrides"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vision_tower.model.layers.0.mlp.down_proj"), std::string::npos) << msg;
  // The exact key wins over prefixed ones.
  amb["quantization"]["model.layers.0.mlp.down_proj"] = {{"bits", 3}};
  EXPECT_EQ(QuantizationConfig::from_config(amb, "config.json")->spec_for("model.layers.0.mlp.down_proj"),
            (hearth::nn::QuantSpec{3, 64}));
}

TEST(QuantizationConfig, AcceptsQuantizationConfigKey) {
  auto q = QuantizationConfig::from_config(json::parse(R"({"quantization_config": {"group_size": 32, "bits": 3}})"),
                                           "config.json");
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->default_spec, (hearth::nn::QuantSpec{3, 32}));
}

TEST(QuantizationConfig, BadValues) {
  EXPECT_EQ(error_of([] {
              QuantizationConfig::from_config(json::parse(R"({"quantization": {"group_size": 64, "bits": 7}})"),
                                              "config.json");
            }),
            "config.json: quantization.bits: 7 unsupported (expected 2,3,4,5,6,8)");
  EXPECT_EQ(error_of([] {
              QuantizationConfig::from_config(
                  json::parse(R"({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}})"), "config.json");
            }),
            "config.json: quantization.mode: \"mxfp4\" unsupported (expected \"affine\")");
  EXPECT_NE(error_of([] {
              QuantizationConfig::from_config(json::parse(R"({"quantization": {"group_size": 48, "bits": 4}})"),
                                              "config.json");
            }).find("config.json: quantization.group_size: 48 unsupported"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              QuantizationConfig::from_config(json::parse(R"({"quantization": {"bits": 4}})"), "config.json");
            }).find("missing 'group_size'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              QuantizationConfig::from_config(
                  json::parse(R"({"quantization": {"group_size": 64, "bits": 4, "lm_head": {"bits": 9}}})"),
                  "config.json");
            }).find("config.json: quantization.lm_head.bits: 9 unsupported"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              QuantizationConfig::from_config(json::parse(R"({"quantization_config": {"quant_method": "gptq"}})"),
                                              "config.json");
            }).find("quant_method \"gptq\" unsupported"),
            std::string::npos);
}
