// Micro-benchmark: the per-token cost of structured-output masking (GrammarConstraint::mask +
// accept) on a real vocabulary, for a JSON Schema and for free JSON, cold (a fresh automaton: the
// first visit of each state walks the vocabulary trie) and warm (the automaton of an earlier
// request with the same schema, masks memoized). Not a correctness test (tests/grammar/ are).
// Build with -DHEARTH_BUILD_BENCH=ON; HEARTH_BENCH_TOKENIZER=<dir with tokenizer.json> picks the
// vocabulary (default: models/starter, 32K; e.g. a Llama 3 tokenizer for 128K).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "core/source_dir.h"
#include "grammar/json_schema.h"
#include "grammar/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using namespace hearth;

struct Setup {
  std::shared_ptr<const grammar::Vocabulary> vocab;
  int64_t eos = 0;
};

const Setup& setup() {
  static Setup s = [] {
    const char* env = std::getenv("HEARTH_BENCH_TOKENIZER");
    const fs::path dir = env ? fs::path(env) : fs::path(HEARTH_SOURCE_DIR) / "models/starter";
    auto tok = tokenizer::Tokenizer::from_files(dir / "tokenizer.json",
                                                fs::exists(dir / "tokenizer_config.json") ? dir / "tokenizer_config.json" : fs::path());
    Setup out;
    for (const char* e : {"<|eot_id|>", "<|im_end|>", "</s>", "<|endoftext|>"})
      if (auto id = tok.token_to_id(e)) {
        out.eos = *id;
        break;
      }
    out.vocab = grammar::Vocabulary::from_tokenizer(tok, {out.eos});
    return out;
  }();
  return s;
}

std::shared_ptr<grammar::Grammar> schema_grammar() {
  return grammar::compile_json_schema(nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 40}, "color": {"enum": ["red", "green", "blue"]},
      "count": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
      "when": {"type": "string", "format": "date"}, "ok": {"type": "boolean"}},
      "required": ["name", "color", "count", "tags", "when", "ok"], "additionalProperties": false})"));
}

// Runs sequences with random logits (greedy over the masked logits) and times mask + accept only.
void run(benchmark::State& st, const std::shared_ptr<grammar::Grammar>& g, bool warm) {
  const Setup& s = setup();
  const int64_t V = s.vocab->size();
  at::manual_seed(0);
  at::Tensor noise = at::randn({64, V});
  std::shared_ptr<grammar::TokenAutomaton> shared = std::make_shared<grammar::TokenAutomaton>(g, s.vocab);
  int64_t tokens = 0;
  int64_t seq = 0;
  for (auto _ : st) {
    st.PauseTiming();
    auto automaton = warm ? shared : std::make_shared<grammar::TokenAutomaton>(g, s.vocab);
    grammar::GrammarConstraint c(automaton);
    st.ResumeTiming();
    for (int step = 0; step < 256 && !c.complete(); ++step) {
      st.PauseTiming();
      at::Tensor logits = noise[(seq + step) % 64].clone();
      st.ResumeTiming();
      c.mask(logits);
      st.PauseTiming();
      const int64_t id = logits.argmax().item<int64_t>();
      st.ResumeTiming();
      if (id == s.eos) break;
      c.accept(id);
      ++tokens;
    }
    ++seq;
  }
  st.counters["tokens/seq"] = benchmark::Counter(static_cast<double>(tokens) / std::max<int64_t>(seq, 1));
  st.counters["us/token"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate | benchmark::Counter::kInvert,
                                               benchmark::Counter::kIs1000);
  st.counters["V"] = static_cast<double>(V);
}

void BM_SchemaCold(benchmark::State& st) { run(st, schema_grammar(), false); }
void BM_SchemaWarm(benchmark::State& st) { run(st, schema_grammar(), true); }
void BM_JsonObjectCold(benchmark::State& st) { run(st, grammar::json_object_grammar(), false); }
void BM_JsonObjectWarm(benchmark::State& st) { run(st, grammar::json_object_grammar(), true); }

// One trie walk in the costliest state (inside a free string: nearly every token allowed).
void BM_StringStateWalk(benchmark::State& st) {
  const Setup& s = setup();
  auto g = grammar::compile_json_schema(nlohmann::ordered_json::parse(R"({"type": "string"})"));
  for (auto _ : st) {
    grammar::TokenAutomaton a(g, s.vocab);
    const int32_t inside = a.advance(0, *std::find_if(s.vocab->trie_tokens().begin(), s.vocab->trie_tokens().end(),
                                                      [&](int32_t id) { return s.vocab->bytes(id) == "\""; }));
    benchmark::DoNotOptimize(a.mask(inside));
  }
}

BENCHMARK(BM_SchemaCold)->Unit(benchmark::kMillisecond)->Iterations(8);
BENCHMARK(BM_SchemaWarm)->Unit(benchmark::kMillisecond)->Iterations(32);
BENCHMARK(BM_JsonObjectCold)->Unit(benchmark::kMillisecond)->Iterations(8);
BENCHMARK(BM_JsonObjectWarm)->Unit(benchmark::kMillisecond)->Iterations(32);
BENCHMARK(BM_StringStateWalk)->Unit(benchmark::kMillisecond)->Iterations(10);

}  // namespace

BENCHMARK_MAIN();
