// Tests for io/hf_config and io/atomic_file: generation_config.json, JSON errors, and atomic
// writes. (The MLX quantization block: tests/nn/quant_config_test.cpp.)
#include <gtest/gtest.h>

#include "../test_util.h"

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "io_test_util.h"

using hearth::io::GenerationConfig;
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
