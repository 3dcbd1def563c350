// Gemma4Config: transformers' defaults and derived per-layer geometry (KV donors, head dims,
// double-wide MLPs), both config.json styles (global_head_dim as Google ships it, per_layer_config
// as transformers 5.17 writes it), and one-line errors naming file and field for bad input; plus
// load errors for missing per-layer tensors.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "models/gemma4/config.h"
#include "models/registry.h"
#include "nn/param_source.h"
#include "test_paths.h"

using hearth::models::gemma4::Gemma4Config;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kGolden = fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models";

json e4b_like() {
  return json::parse(R"({
    "model_type": "gemma4_text", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "global_head_dim": 32, "sliding_window": 8, "num_kv_shared_layers": 3, "use_double_wide_mlp": true,
    "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 512, "final_logit_softcapping": 30.0,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                    "sliding_attention", "full_attention"]})");
}

// The message of the hearth::Error `f` throws ("" when it throws none).
template <typename F>
std::string gemma4_config_error_of(F f) {
  try {
    f();
  } catch (const hearth::Error& e) {
    return e.what();
  }
  return "";
}

void expect_gemma4_config_error(const json& j, const std::string& field, const std::string& what) {
  const std::string msg = gemma4_config_error_of([&] { Gemma4Config::from_json(j, "config.json"); });
  EXPECT_NE(msg.find("config.json: " + field), std::string::npos) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

}  // namespace

TEST(Gemma4Config, DerivedGeometry) {
  Gemma4Config c = Gemma4Config::from_json(e4b_like(), "config.json");
  EXPECT_EQ(c.first_kv_shared_layer(), 3);
  EXPECT_EQ(c.kv_source(3), 1);  // last sliding layer before the sharers
  EXPECT_EQ(c.kv_source(4), 1);
  EXPECT_EQ(c.kv_source(5), 2);  // last full layer
  EXPECT_TRUE(c.kv_donor(1));
  EXPECT_TRUE(c.kv_donor(2));
  EXPECT_FALSE(c.kv_donor(0));
  EXPECT_EQ(c.layer_head_dim(0), 16);
  EXPECT_EQ(c.layer_head_dim(2), 32);
  EXPECT_EQ(c.layer_kv_heads(2), 2);  // no k_eq_v: num_global_key_value_heads is not used
  EXPECT_EQ(c.layer_intermediate(2), 96);
  EXPECT_EQ(c.layer_intermediate(3), 192);  // double-wide on sharers
  EXPECT_EQ(c.full_rope.type, "proportional");  // transformers' default rope_parameters
  EXPECT_DOUBLE_EQ(c.full_rope.partial_rotary_factor, 0.25);
  EXPECT_DOUBLE_EQ(c.full_rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c.sliding_rope.theta, 1e4);
  ASSERT_TRUE(c.final_logit_softcapping);
  EXPECT_DOUBLE_EQ(*c.final_logit_softcapping, 30.0);

  json k = e4b_like();
  k["attention_k_eq_v"] = true;
  k["num_global_key_value_heads"] = 1;
  k["layer_types"][5] = "sliding_attention";  // transformers forces the last layer to full attention
  c = Gemma4Config::from_json(k, "config.json");
  EXPECT_FALSE(c.sliding[5]);
  EXPECT_EQ(c.layer_kv_heads(2), 1);
  EXPECT_EQ(c.layer_kv_heads(0), 2);
  EXPECT_TRUE(c.k_eq_v(2));
  EXPECT_FALSE(c.k_eq_v(1));

  // transformers 5.17's per_layer_config replaces global_head_dim / num_global_key_value_heads.
  json p = e4b_like();
  p["global_head_dim"] = 512;
  p["per_layer_config"] = {{"2", {{"head_dim", 32}, {"num_key_value_heads", 1}}}, {"5", {{"head_dim", 32}}}};
  c = Gemma4Config::from_json(p, "config.json");
  EXPECT_EQ(c.layer_head_dim(2), 32);
  EXPECT_EQ(c.layer_kv_heads(2), 1);
  EXPECT_EQ(c.layer_kv_heads(5), 2);

  // The multimodal wrapper reads text_config; tie_word_embeddings is top-level.
  json mm = {{"model_type", "gemma4"}, {"text_config", e4b_like()}, {"vision_config", {{"model_type", "gemma4_vision"}}}};
  c = Gemma4Config::from_json(mm, "config.json");
  EXPECT_TRUE(c.wrapped);
  EXPECT_EQ(c.num_hidden_layers, 6);
}

TEST(Gemma4Config, BadInputIsOneLineNamingFileAndField) {
  json j = e4b_like();
  j["layer_types"].erase(0);
  expect_gemma4_config_error(j, "layer_types", "has 5 entries for num_hidden_layers = 6");
  j = e4b_like();
  j["layer_types"][1] = "local";
  expect_gemma4_config_error(j, "layer_types[1]", "is not sliding_attention or full_attention");
  j = e4b_like();
  j["layer_types"] = {"full_attention", "full_attention", "full_attention", "sliding_attention", "sliding_attention",
                      "full_attention"};
  expect_gemma4_config_error(j, "num_kv_shared_layers", "layer 3 (sliding_attention) shares the K/V");
  j = e4b_like();
  j["num_kv_shared_layers"] = 6;
  expect_gemma4_config_error(j, "num_kv_shared_layers", "leaves no layer computing its own K/V");
  for (const json& w : {json(0), json(-4), json("8")}) {
    j = e4b_like();
    j["sliding_window"] = w;
    expect_gemma4_config_error(j, "sliding_window", "must be a positive integer");
  }
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
    j = e4b_like();
    j.erase(key);
    expect_gemma4_config_error(j, key, "missing required key");
  }
  j = e4b_like();
  j["enable_moe_block"] = true;
  expect_gemma4_config_error(j, "enable_moe_block", "mixture-of-experts block is not supported");
  j = e4b_like();
  j["hidden_activation"] = "silu";
  expect_gemma4_config_error(j, "hidden_activation", "only gelu_pytorch_tanh");
  j = e4b_like();
  j["rope_parameters"] = {{"sliding_attention", {{"rope_type", "yarn"}}}, {"full_attention", json::object()}};
  expect_gemma4_config_error(j, "rope_parameters.sliding_attention.rope_type", "unsupported rope type 'yarn'");
  j = e4b_like();
  j["rope_parameters"] = {{"sliding_attention", {{"rope_type", "default"}}}};
  expect_gemma4_config_error(j, "rope_parameters", "has no entry for full_attention");
  j = e4b_like();
  j["per_layer_config"] = {{"9", {{"head_dim", 32}}}};
  expect_gemma4_config_error(j, "per_layer_config.9", "not a layer index");
  j = e4b_like();
  j["per_layer_config"] = {{"2", {{"head_dim", 32}}}, {"5", {{"head_dim", 64}}}};
  expect_gemma4_config_error(j, "per_layer_config", "layers 2 and 5 (full_attention) have head dims 32 and 64");
  j = e4b_like();
  j["num_key_value_heads"] = 3;
  expect_gemma4_config_error(j, "num_key_value_heads", "must be a multiple of it");
  json mm = {{"model_type", "gemma4"}};
  expect_gemma4_config_error(mm, "text_config", "missing");
  mm["text_config"] = e4b_like();
  mm["text_config"]["sliding_window"] = 0;
  expect_gemma4_config_error(mm, "text_config.sliding_window", "must be a positive integer");
  // Through the registry: the family's check, as `hearth info` runs it.
  j = e4b_like();
  j["layer_types"].erase(0);
  EXPECT_NE(gemma4_config_error_of([&] { hearth::models::check_config(j, "config.json"); }).find("config.json: layer_types"),
            std::string::npos);
}

// A checkpoint that lacks a tensor its config needs: one line naming the tensor.
TEST(Gemma4Config, MissingPerLayerTensorsNameTheTensor) {
  const fs::path dir = kGolden / "gemma4_e";
  auto file = hearth::io::SafetensorsFile::open(dir / "model.safetensors");
  const json cfg = hearth::io::read_json(dir / "config.json");
  for (const std::string missing : {"model.embed_tokens_per_layer.weight", "model.per_layer_model_projection.weight",
                                    "model.layers.4.per_layer_input_gate.weight",
                                    "model.layers.1.post_per_layer_input_norm.weight", "model.layers.2.self_attn.k_proj.weight",
                                    "model.layers.0.pre_feedforward_layernorm.weight"}) {
    std::map<std::string, at::Tensor> w;
    for (const auto& info : file->tensors())
      if (info.name != missing) w[info.name] = file->tensor(info.name);
    hearth::nn::TensorMapSource src(std::move(w), "model.safetensors");
    const std::string msg = gemma4_config_error_of(
        [&] { hearth::models::build_model({cfg, "config.json", src, std::nullopt, hearth::nn::LoadOptions{}}); });
    EXPECT_NE(msg.find(missing), std::string::npos) << missing << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // Per-layer tensors of the wrong width (hidden_size_per_layer_input says 8, the weights hold 16).
  json bad = cfg;
  bad["hidden_size_per_layer_input"] = 8;
  std::map<std::string, at::Tensor> w;
  for (const auto& info : file->tensors()) w[info.name] = file->tensor(info.name);
  hearth::nn::TensorMapSource src(std::move(w), "model.safetensors");
  const std::string msg =
      gemma4_config_error_of([&] { hearth::models::build_model({bad, "config.json", src, std::nullopt, hearth::nn::LoadOptions{}}); });
  EXPECT_NE(msg.find("embed_tokens_per_layer"), std::string::npos) << msg;
}
