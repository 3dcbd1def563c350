// Huge enums on a real vocabulary (models/starter, 32K tokens): how long the engine thread spends
// on one request's token mask, from the first state to the end of the value. Not the mask's
// correctness (token_constraint_test.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/source_dir.h"
#include "grammar/json_schema.h"
#include "grammar/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace hearth::grammar {
namespace {

namespace fs = std::filesystem;
using J = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct MaskRun {
  double worst_ms = 0, total_ms = 0;  // the automaton's construction counts as a step
  int steps = 0;
  std::string text;
  size_t states = 0;
};

// Greedy over a fixed preference (the allowed token with the longest bytes, as a model that knows
// the value), timing each mask: the engine thread's cost per step.
MaskRun run(const std::shared_ptr<Grammar>& g, const std::shared_ptr<const Vocabulary>& vocab, int max_steps = 200) {
  MaskRun r;
  auto t0 = Clock::now();
  auto automaton = std::make_shared<TokenAutomaton>(g, vocab);  // on the engine thread too (make_constraint)
  r.worst_ms = r.total_ms = ms_since(t0);
  GrammarConstraint c(automaton);
  at::Tensor pref = at::zeros({vocab->size()});
  for (int64_t i = 0; i < vocab->size(); ++i) pref[i] = static_cast<float>(vocab->bytes(i).size());
  while (!c.complete() && r.steps < max_steps) {
    at::Tensor logits = pref.clone();
    auto t = Clock::now();
    c.mask(logits);
    const double ms = ms_since(t);
    r.worst_ms = std::max(r.worst_ms, ms);
    r.total_ms += ms;
    const int64_t id = logits.argmax().item<int64_t>();
    if (!std::isfinite(logits[id].item<float>()) || vocab->is_eos(id)) break;
    c.accept(id);
    r.text += vocab->bytes(id);
    ++r.steps;
  }
  r.states = automaton->num_states();
  return r;
}

TEST(EnumMask, TwentyThousandLongStringsNeverStallOneStepForLong) {
  const fs::path dir = fs::path(HEARTH_SOURCE_DIR) / "models/starter";
  auto tok = tokenizer::Tokenizer::from_files(dir / "tokenizer.json", dir / "tokenizer_config.json");
  auto vocab = Vocabulary::from_tokenizer(tok, {0});
  J values = J::array();
  // 20,000 values of ~45 bytes sharing a long prefix (as product names, paths or sentences do): in
  // every state along the prefix each value was a thread of its own.
  for (int i = 0; i < 20000; ++i)
    values.push_back("an option from the very long list of choices: item " + std::to_string(100000 + i * 7919 % 100003) +
                     "/" + std::to_string(i % 97));
  // Before: the enum as one alternative per value (how json_schema.cpp compiled it), so every
  // automaton state inside the value held a thread per value still possible. About 4 s, so only
  // with HEARTH_MEASURE_BEFORE=1 (docs/architecture.md quotes its numbers).
  if (std::getenv("HEARTH_MEASURE_BEFORE")) {
    auto flat = std::make_shared<Grammar>();
    const int32_t root = flat->new_rule();
    const int32_t close = flat->literal("}", flat->ret());
    std::vector<int32_t> alts;
    for (const auto& v : values) alts.push_back(flat->literal(v.dump(), close));
    flat->set_rule_start(root, flat->literal("{\"pick\": ", flat->split(std::move(alts))));
    flat->set_root(root);
    const MaskRun before = run(flat, vocab, /*max_steps=*/6);  // the first steps show the stall
    std::printf("enum 20000 x ~60 bytes, one alternative per value: first %d steps, worst mask %.1f ms, total %.1f ms, %zu states\n",
                before.steps, before.worst_ms, before.total_ms, before.states);
  }
  auto t0 = Clock::now();
  auto g = compile_json_schema(J{{"type", "object"}, {"properties", {{"pick", {{"enum", values}}}}},
                                 {"required", {"pick"}}, {"additionalProperties", false}});
  const double compile_ms = ms_since(t0);
  const MaskRun after = run(g, vocab);
  std::printf("enum 20000 x ~60 bytes, compiled (a trie): compile %.1f ms, %d steps, worst mask %.1f ms, total %.1f ms, %zu states\n",
              compile_ms, after.steps, after.worst_ms, after.total_ms, after.states);
  const J parsed = J::parse(after.text);
  EXPECT_NE(std::find(values.begin(), values.end(), parsed["pick"]), values.end()) << after.text;
  EXPECT_LT(after.worst_ms, 100.0);
  EXPECT_LT(compile_ms, 2000.0);
  // Values with nothing in common but the quote: the trie is as large as their bytes, within the
  // grammar's node cap, and still fast.
  J spread = J::array();
  for (int i = 0; i < 20000; ++i) spread.push_back(std::to_string(i * 7919 % 100003) + " unique tail " + std::to_string(i));
  t0 = Clock::now();
  auto sg = compile_json_schema(J{{"enum", spread}});
  const double spread_compile_ms = ms_since(t0);
  const MaskRun sr = run(sg, vocab);
  std::printf("enum 20000 x ~20 bytes, no shared prefix: compile %.1f ms, %d steps, worst mask %.1f ms, total %.1f ms\n",
              spread_compile_ms, sr.steps, sr.worst_ms, sr.total_ms);
  EXPECT_NE(std::find(spread.begin(), spread.end(), J::parse(sr.text)), spread.end()) << sr.text;
  EXPECT_LT(sr.worst_ms, 100.0);
  // An enum whose bytes would unroll past the cap is refused (400) instead of taking ~100 bytes of
  // server memory per byte of request.
  J huge = J::array();
  for (int i = 0; i < 20000; ++i) huge.push_back(std::to_string(i) + std::string(40, 'x'));
  EXPECT_THROW(compile_json_schema(J{{"enum", huge}}), InvalidArgument);
}

TEST(EnumMask, EnumTrieAcceptsExactlyTheValues) {
  auto g = compile_json_schema(J::parse(R"({"enum": ["a", "aa", "aaa", "ab", "b", 1, 12, null, {"k": [1]}, "é", "a"]})"));
  for (const char* ok : {"\"a\"", "\"aa\"", "\"aaa\"", "\"ab\"", "\"b\"", "1", "12", "null", R"({"k":[1]})", "\"é\""}) {
    Automaton a(g);
    EXPECT_TRUE(a.accepting(a.walk(a.start(), ok))) << ok;
  }
  for (const char* bad : {"\"\"", "\"aaaa\"", "\"ba\"", "2", "123", "\"a", "nul", "\"e\""}) {
    Automaton a(g);
    EXPECT_FALSE(a.accepting(a.walk(a.start(), bad))) << bad;
  }
  // A deep chain of prefixes ("a", "aa", ... 3,000 long) builds without deep recursion.
  J chain = J::array();
  for (int i = 1; i <= 3000; ++i) chain.push_back(std::string(static_cast<size_t>(i), 'a'));
  auto deep = compile_json_schema(J{{"enum", chain}});
  Automaton a(deep);
  EXPECT_TRUE(a.accepting(a.walk(a.start(), "\"" + std::string(2999, 'a') + "\"")));
  EXPECT_FALSE(a.accepting(a.walk(a.start(), "\"" + std::string(3001, 'a') + "\"")));
}

}  // namespace
}  // namespace hearth::grammar
