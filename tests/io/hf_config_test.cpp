// Tests for io/hf_config and io/atomic_file: generation_config.json, the MLX quantization block
// (defaults, overrides, bad bits/mode), JSON errors, and atomic writes.
#include <gtest/gtest.h>

#include "../test_util.h"

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "io_test_util.h"

using hearth::io::GenerationConfig;
using hearth::io::QuantizationConfig;
using hearth::testing::TempDir;
using nlohmann::json;

using hearth::testing::error_of;

TEST(GenerationConfig, MissingFileIsEmpty) {
  TempDir d;
  GenerationConfig g = GenerationConfig::load(d.path());
  EXPECT_TRUE(g.eos_token_ids.empty());
  EXPECT_FALSE(g.temperature.has_value());
}

TEST(GenerationConfig, EosIntOrList) {
  TempDir d;
  hearth::io::write_file_atomic(d / "generation_config.json",
                                R"({"eos_token_id": 2, "bos_token_id": 1, "temperature": 0.6, "top_p": 0.9,
                                    "top_k": 20, "do_sample": true, "transformers_version": "4.5"})");
  GenerationConfig g = GenerationConfig::load(d.path());
  EXPECT_EQ(g.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(g.bos_token_id, 1);
  EXPECT_DOUBLE_EQ(*g.temperature, 0.6);
  EXPECT_DOUBLE_EQ(*g.top_p, 0.9);
  EXPECT_EQ(g.top_k, 20);
  EXPECT_EQ(g.do_sample, true);
  hearth::io::write_file_atomic(d / "generation_config.json", R"({"eos_token_id": [128001, 128009]})");
  EXPECT_EQ(GenerationConfig::load(d.path()).eos_token_ids, (std::vector<int64_t>{128001, 128009}));
  hearth::io::write_file_atomic(d / "generation_config.json", R"({"eos_token_id": "x"})");
  EXPECT_NE(error_of([&] { GenerationConfig::load(d.path()); }).find("generation_config.json: eos_token_id must be"),
            std::string::npos);
  hearth::io::write_file_atomic(d / "generation_config.json", "{,}");
  EXPECT_NE(error_of([&] { GenerationConfig::load(d.path()); }).find("generation_config.json: invalid JSON (parse error"),
            std::string::npos);
}

// Values that would make every request fail later (sampler checks) are refused at load, one line
// naming the file and field.
TEST(GenerationConfig, OutOfRangeValuesFailAtLoad) {
  TempDir d;
  const std::pair<const char*, const char*> cases[] = {
      {R"({"temperature": -1})", "generation_config.json: temperature must be a finite number >= 0, got -1"},
      {R"({"top_p": 1.5})", "generation_config.json: top_p must be in [0, 1], got 1.5"},
      {R"({"min_p": -0.1})", "generation_config.json: min_p must be in [0, 1], got -0.1"},
      {R"({"top_k": -1})", "generation_config.json: top_k must be >= 0 (0 = off), got -1"},
      {R"({"top_k": 1e3})", "generation_config.json: top_k must be an integer, got 1000.0"},
      {R"({"repetition_penalty": 0})", "generation_config.json: repetition_penalty must be a finite number > 0"},
      {R"({"eos_token_id": -5})", "generation_config.json: eos_token_id must be a token id"},
      {R"({"eos_token_id": [2, 99999999999]})", "generation_config.json: eos_token_id must be a token id"},
      {R"({"bos_token_id": 18446744073709551615})", "generation_config.json: bos_token_id must be a token id"},
      {R"({"temperature": "hot"})", "generation_config.json: temperature must be a number, got \"hot\""},
  };
  for (const auto& [text, want] : cases) {
    hearth::io::write_file_atomic(d / "generation_config.json", text);
    const std::string msg = error_of([&] { GenerationConfig::load(d.path()); });
    EXPECT_NE(msg.find(want), std::string::npos) << text << " -> " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  hearth::io::write_file_atomic(d / "generation_config.json", R"({"temperature": 0, "top_p": 1, "top_k": 0})");
  EXPECT_EQ(*GenerationConfig::load(d.path()).temperature, 0.0);
}

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

TEST(AtomicFile, WritesAndLeavesNoTempOnFailure) {
  TempDir d;
  auto p = d / "f.txt";
  hearth::io::write_file_atomic(p, "hello");
  EXPECT_EQ(hearth::io::read_file(p), "hello");
  EXPECT_THROW(hearth::io::write_file_atomic(p,
                                             [](std::ostream& out) {
                                               out << "partial";
                                               throw hearth::Error("boom");
                                             }),
               hearth::Error);
  EXPECT_EQ(hearth::io::read_file(p), "hello");  // old content intact
  size_t n = 0;
  for (auto& e : std::filesystem::directory_iterator(d.path())) (void)e, ++n;
  EXPECT_EQ(n, 1u);
  EXPECT_NE(error_of([&] { hearth::io::read_file(d / "nope"); }).find("nope: cannot open (no such file)"),
            std::string::npos);
  EXPECT_THROW(hearth::io::write_file_atomic(d / "no_dir" / "x", "y"), hearth::Error);
}
