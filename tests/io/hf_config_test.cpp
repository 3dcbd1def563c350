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
  EXPECT_NE(error_of([&] { hearth::io::read_file(d / "nope"); }).find("nope: cannot read (no such file)"),
            std::string::npos);
  EXPECT_THROW(hearth::io::write_file_atomic(d / "no_dir" / "x", "y"), hearth::Error);
}
