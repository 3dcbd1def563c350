// Token masks on a small hand-made vocabulary: the exact allowed ids at each step of a schema,
// EOS only once the value is complete, padding ids forbidden, forbidden tokens refused by
// accept(), and the Sampler drawing only valid JSON under random logits at temperature 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"
#include "generate/sampler.h"
#include "grammar/json_schema.h"
#include "grammar/token_constraint.h"

namespace hearth::grammar {
namespace {

using J = nlohmann::ordered_json;

// ids: 0 "{"  1 "}"  2 "\""  3 "a"  4 "\"a\""  5 ":"  6 " "  7 "1"  8 "{\""  9 EOS  10 unusable "x"
//      11 "a\":"  12 "}}"  13 "0"
std::shared_ptr<const Vocabulary> small_vocab() {
  std::vector<std::string> bytes = {"{", "}", "\"", "a", "\"a\"", ":", " ", "1", "{\"", "", "x", "a\":", "}}", "0"};
  std::vector<bool> usable(bytes.size(), true);
  usable[10] = false;
  return std::make_shared<const Vocabulary>(bytes, usable, std::vector<int64_t>{9});
}

std::vector<int64_t> allowed(GrammarConstraint& c, int64_t V) {
  at::Tensor logits = at::zeros({V});
  c.mask(logits);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < V; ++i)
    if (std::isfinite(logits[i].item<float>())) ids.push_back(i);
  return ids;
}

std::shared_ptr<TokenAutomaton> object_a(const std::shared_ptr<const Vocabulary>& v) {
  auto g = compile_json_schema(J::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                             "required": ["a"], "additionalProperties": false})"));
  return std::make_shared<TokenAutomaton>(g, v);
}

TEST(TokenConstraint, MasksStepByStep) {
  auto vocab = small_vocab();
  GrammarConstraint c(object_a(vocab));
  const int64_t V = 16;  // two padding ids past the vocabulary: always forbidden
  EXPECT_EQ(allowed(c, V), (std::vector<int64_t>{0, 8}));
  c.accept(8);  // {"
  EXPECT_EQ(allowed(c, V), (std::vector<int64_t>{3, 11}));
  c.accept(3);  // a
  EXPECT_EQ(allowed(c, V), (std::vector<int64_t>{2}));
  c.accept(2);  // "
  EXPECT_EQ(allowed(c, V), (std::vector<int64_t>{5, 6}));
  c.accept(5);  // :
  EXPECT_EQ(allowed(c, V), (std::vector<int64_t>{6, 7, 13}));
  c.accept(7);  // 1
  EXPECT_EQ(allowed(c, V), (std::vector<int64_t>{1, 6, 7, 13}));
  EXPECT_FALSE(c.complete());
  EXPECT_THROW(c.accept(9), Error);   // EOS before the object is closed
  EXPECT_THROW(c.accept(12), Error);  // "}}" closes one object too many
  EXPECT_THROW(c.accept(10), Error);  // unusable
  c.accept(1);  // }
  EXPECT_TRUE(c.complete());
  EXPECT_EQ(allowed(c, V), (std::vector<int64_t>{9}));
  c.accept(9);
}

TEST(TokenConstraint, ZeroAfterMinusAndLeadingZero) {
  auto vocab = small_vocab();
  GrammarConstraint c(object_a(vocab));
  for (int64_t id : {8, 11}) c.accept(id);  // {"a":
  c.accept(13);                              // 0: no digit may follow a leading zero
  EXPECT_EQ(allowed(c, 14), (std::vector<int64_t>{1, 6}));
}

TEST(TokenConstraint, VocabularyTrieKeepsEveryUsableToken) {
  auto vocab = small_vocab();
  std::vector<int32_t> toks = vocab->trie_tokens();
  std::sort(toks.begin(), toks.end());
  EXPECT_EQ(toks, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13}));  // not EOS, not the unusable one
  // Preorder with subtree ends: "{" (0) holds "{\"" (8) below it.
  const auto& trie = vocab->trie();
  size_t brace = 0;
  while (trie[brace].byte != '{' || trie[brace].depth != 1) ++brace;
  EXPECT_EQ(trie[brace].end, static_cast<int32_t>(brace) + 2);
  EXPECT_EQ(trie[brace + 1].byte, '"');
  EXPECT_EQ(trie[brace + 1].depth, 2);
}

// Random logits at temperature 1 through the real Sampler: every run ends in EOS with {"a":<int>}.
TEST(TokenConstraint, SamplerDrawsOnlyValidJson) {
  auto vocab = small_vocab();
  auto automaton = object_a(vocab);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 3);
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    generate::SamplingParams p;
    p.temperature = 1.0;
    p.seed = seed;
    p.constraint = std::make_shared<GrammarConstraint>(automaton);
    generate::Sampler sampler(p);
    std::string text;
    bool eos = false;
    for (int step = 0; step < 200 && !eos; ++step) {
      at::Tensor logits = at::empty({14});
      for (int64_t i = 0; i < 14; ++i) logits[i] = normal(rng);
      logits[9] = 5.0;  // the model would like to stop at once
      const int64_t id = sampler.sample(logits, {});
      if (id == 9) eos = true;
      else text += vocab->bytes(id);
    }
    ASSERT_TRUE(eos) << text;
    J v = J::parse(text);
    ASSERT_TRUE(v.is_object()) << text;
    EXPECT_EQ(v.size(), 1u) << text;
    EXPECT_TRUE(v["a"].is_number_integer()) << text;
  }
}

}  // namespace
}  // namespace hearth::grammar
