// ModelEngine with its prompt cache on tiny golden models (CPU fp32): every reuse case gives the
// same greedy tokens and logprobs (within 1e-5) as an engine with the cache off, and reports
// Finish::cached_tokens = the reused prefix: a shared prefix, a multi-turn chat, an identical
// prompt (length - 1), no reuse across adapter selections, unmount dropping entries, eviction by
// bytes, a sliding-window model past its window, dynamic RoPE turning the cache off, and the
// OpenAI usage field through HTTP.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <thread>

#include "../adapters/lora_test_util.h"
#include "../io/io_test_util.h"
#include "server/model_engine.h"
#include "server/server.h"

namespace hearth::server {
namespace {

namespace fs = std::filesystem;
using J = nlohmann::json;
using hearth::testing::golden_lora;
using hearth::testing::golden_model;

struct Outcome {
  std::vector<int64_t> prompt, ids;
  std::vector<float> logprobs;
  std::string text;
  Finish f;
  double ttft_s = 0;
};

Outcome run(ModelEngine& e, const CompletionRequest& r) {
  Outcome out;
  Prompt p = e.prepare(r);
  out.prompt = p.ids;
  out.f = e.generate(p, r, [&](const TokenEvent& ev) {
    out.text += ev.text;
    if (ev.text_only) return true;
    out.ids.push_back(ev.id);
    out.logprobs.push_back(ev.logprob);
    return true;
  });
  out.ttft_s = e.last_stats().ttft_s;
  return out;
}

CompletionRequest completion(const std::string& prompt, int64_t max_tokens = 10, const std::string& adapter = "") {
  CompletionRequest r;
  r.chat = false;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0;
  r.logprobs = true;
  if (!adapter.empty()) r.adapter = adapter;
  return r;
}

ModelEngineOptions options(const fs::path& dir, int64_t cache_bytes) {
  ModelEngineOptions o;
  o.model_dir = dir;
  o.device = "cpu";
  o.dtype = "float32";
  o.prompt_cache_bytes = cache_bytes;
  return o;
}

// What the cache holds after `r`: its prompt and generated ids, less the last one unless an EOS
// ended it (that token was sampled but never fed back).
std::vector<int64_t> history(const Outcome& r) {
  std::vector<int64_t> h = r.prompt;
  h.insert(h.end(), r.ids.begin(), r.ids.end());
  if (r.f.reason != Finish::Reason::kEos && !r.ids.empty()) h.pop_back();
  return h;
}
int64_t lcp(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return static_cast<int64_t>(i);
}
int64_t expected_cached(const Outcome& before, const std::vector<int64_t>& prompt) {
  return std::min<int64_t>(lcp(history(before), prompt), static_cast<int64_t>(prompt.size()) - 1);
}

void expect_same_output(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_EQ(a.prompt, b.prompt) << what;
  EXPECT_EQ(a.ids, b.ids) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  for (size_t i = 0; i < a.logprobs.size(); ++i) EXPECT_NEAR(a.logprobs[i], b.logprobs[i], 1e-5) << what << " step " << i;
  EXPECT_EQ(a.f.reason, b.f.reason) << what;
}

// Words until the prompt is at least `n` tokens.
std::string text_of_at_least(ModelEngine& e, int64_t n, const std::string& seed) {
  std::string t;
  for (int i = 0; t.empty() || static_cast<int64_t>(e.prepare(completion(t)).ids.size()) < n; i += 4)
    for (int j = i; j < i + 4; ++j) t += seed + std::to_string(j * 7 % 13) + " ";
  return t;
}

TEST(PromptCacheEngine, ASharedPrefixIsReusedAndTheOutputIsUnchanged) {
  ModelEngine cached(options(golden_model("llama_mha"), -1)), plain(options(golden_model("llama_mha"), 0));
  ASSERT_NE(cached.prompt_cache(), nullptr);
  ASSERT_EQ(plain.prompt_cache(), nullptr);
  const std::string base = text_of_at_least(plain, 60, "the fox ");
  auto a = completion(base + "jumps over the dog"), b = completion(base + "sleeps in a barn");
  Outcome a1 = run(cached, a), b1 = run(cached, b);
  EXPECT_EQ(a1.f.cached_tokens, 0);
  EXPECT_EQ(b1.f.cached_tokens, expected_cached(a1, b1.prompt));
  EXPECT_GE(b1.f.cached_tokens, 55);
  expect_same_output(a1, run(plain, a), "first request");
  expect_same_output(b1, run(plain, b), "second request");
  EXPECT_EQ(plain.prompt_cache(), nullptr);
  EXPECT_EQ(cached.prompt_cache()->stats().hits, 1);
}

TEST(PromptCacheEngine, AnIdenticalPromptReusesAllButItsLastToken) {
  ModelEngine cached(options(golden_model("llama_mha"), -1)), plain(options(golden_model("llama_mha"), 0));
  auto r = completion("hello world, this is a prompt that we send twice", 8);
  Outcome r1 = run(cached, r), r2 = run(cached, r), ref = run(plain, r);
  EXPECT_EQ(r2.f.cached_tokens, static_cast<int64_t>(r2.prompt.size()) - 1);
  expect_same_output(r1, ref, "first");
  expect_same_output(r2, ref, "second");
}

TEST(PromptCacheEngine, AMultiTurnChatReusesTheEarlierTurns) {
  hearth::testing::TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  fs::copy(golden_model("llama_mha"), dir, fs::copy_options::recursive);
  J cfg = io::read_json(dir / "tokenizer_config.json");
  cfg["chat_template"] =
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1);
  ModelEngine cached(options(dir, -1)), plain(options(dir, 0));
  CompletionRequest r1;
  r1.chat = true;
  r1.messages.push_back(ChatMessage{"user", "tell me a long story about a fox and a dog in a barn", "", "", {}});
  r1.max_tokens = 12;
  r1.sampling.temperature = 0.0;
  r1.logprobs = true;
  Outcome t1 = run(cached, r1);
  CompletionRequest r2 = r1;
  r2.messages.push_back(ChatMessage{"assistant", t1.text, "", "", {}});
  r2.messages.push_back(ChatMessage{"user", "and then what happened?", "", "", {}});
  Outcome t2 = run(cached, r2);
  // The whole first prompt (at least) is reused; exactly what the stored history shares.
  EXPECT_EQ(t2.f.cached_tokens, expected_cached(t1, t2.prompt));
  EXPECT_GE(t2.f.cached_tokens, lcp(t1.prompt, t2.prompt));
  EXPECT_GE(lcp(t1.prompt, t2.prompt), static_cast<int64_t>(t1.prompt.size()) - 1);
  expect_same_output(t2, run(plain, r2), "turn 2");
}

TEST(PromptCacheEngine, AnotherAdapterSelectionNeverReusesAndUnmountDropsItsEntries) {
  auto with_lora = [](int64_t bytes) {
    ModelEngineOptions o = options(golden_model("llama_mha"), bytes);
    o.adapters.emplace_back("lora", golden_lora("llama_mha"));
    return o;
  };
  ModelEngine cached(with_lora(-1)), plain(with_lora(0));
  const std::string p = "hello world, the same prompt for every adapter selection";
  Outcome base = run(cached, completion(p, 8, "none"));
  Outcome lora1 = run(cached, completion(p, 8, "lora"));
  EXPECT_EQ(lora1.f.cached_tokens, 0);  // the base model's entry is not used
  expect_same_output(lora1, run(plain, completion(p, 8, "lora")), "lora, first");
  Outcome lora2 = run(cached, completion(p, 8, "lora"));
  EXPECT_EQ(lora2.f.cached_tokens, static_cast<int64_t>(lora2.prompt.size()) - 1);
  expect_same_output(lora2, lora1, "lora, reused");
  EXPECT_NE(base.ids, lora1.ids);  // the adapter does change the output (else this proves nothing)
  EXPECT_EQ(cached.prompt_cache()->stats().entries, 2);
  ASSERT_TRUE(cached.unmount_adapter("lora"));
  EXPECT_EQ(cached.prompt_cache()->stats().entries, 1);  // only the base model's entry is left
  Outcome base2 = run(cached, completion(p, 8, "none"));
  EXPECT_EQ(base2.f.cached_tokens, static_cast<int64_t>(base2.prompt.size()) - 1);
  expect_same_output(base2, base, "base, reused");
}

TEST(PromptCacheEngine, EntriesAreEvictedByBytes) {
  // Every prompt starts with BOS, so within one namespace a new request takes the best entry
  // rather than adding one; two adapter selections make two entries coexist.
  auto with_lora = [](int64_t bytes) {
    ModelEngineOptions o = options(golden_model("llama_mha"), bytes);
    o.adapters.emplace_back("lora", golden_lora("llama_mha"));
    return o;
  };
  ModelEngine probe(with_lora(-1));
  run(probe, completion("a short prompt", 4));
  const int64_t one = probe.prompt_cache()->stats().bytes;  // every short entry: one 256-token buffer
  ASSERT_GT(one, 0);
  run(probe, completion("a short prompt", 4, "lora"));
  EXPECT_EQ(probe.prompt_cache()->stats().entries, 2);
  EXPECT_EQ(probe.prompt_cache()->stats().bytes, 2 * one);

  ModelEngine cached(with_lora(one + one / 2));  // room for one entry
  auto a = completion("first prompt about foxes", 4), b = completion("second prompt about dogs", 4, "lora");
  run(cached, a);
  run(cached, b);  // evicts a's entry
  EXPECT_EQ(cached.prompt_cache()->stats().entries, 1);
  EXPECT_EQ(cached.prompt_cache()->stats().bytes, one);
  EXPECT_EQ(run(cached, a).f.cached_tokens, 0);  // gone (and b's is another namespace)
  Outcome again = run(cached, a);
  EXPECT_EQ(again.f.cached_tokens, static_cast<int64_t>(again.prompt.size()) - 1);
}

TEST(PromptCacheEngine, ASlidingWindowModelPastItsWindowIsFreshOrExact) {
  // mistral_swa: window 8; the rotating caches compact once a 256-token buffer fills.
  ModelEngineOptions oc = options(golden_model("mistral_swa"), -1), op = options(golden_model("mistral_swa"), 0);
  oc.context_length = op.context_length = 1024;  // past the tiny model's 256 positions, on purpose
  oc.allow_long_context = op.allow_long_context = true;
  ModelEngine cached(oc), plain(op);
  // Short: the buffer still holds everything, so a shared prefix longer than the window is exact.
  const std::string base = text_of_at_least(plain, 40, "wind ");
  Outcome s1 = run(cached, completion(base + "north")), s2 = run(cached, completion(base + "south"));
  EXPECT_EQ(s2.f.cached_tokens, expected_cached(s1, s2.prompt));
  EXPECT_GT(s2.f.cached_tokens, 8);
  expect_same_output(s2, run(plain, completion(base + "south")), "short, reused");
  // Long: a ~245-token prompt fills most of the first 256-token buffer; decoding past 256 tokens
  // compacts it (the early tokens are dropped), so going back to token ~80 is a miss.
  const std::string long_text = text_of_at_least(plain, 240, "rain ");
  Outcome l1 = run(cached, completion(long_text, 24));
  ASSERT_LT(static_cast<int64_t>(l1.prompt.size()), 256);
  ASSERT_GT(static_cast<int64_t>(history(l1).size()), 256);
  auto back = completion(long_text.substr(0, long_text.size() / 3) + "snow", 10);
  Outcome l2 = run(cached, back);
  EXPECT_EQ(l2.f.cached_tokens, 0);
  expect_same_output(l2, run(plain, back), "long, back before the window");
  // Continuing the long history: reused exactly when the kept tokens cover the window, else fresh.
  auto more = completion(long_text + l1.text + " and more", 10);
  Outcome l3 = run(cached, completion(long_text, 24));  // put the long entry back
  expect_same_output(l3, l1, "long, again");
  Outcome l4 = run(cached, more);
  EXPECT_TRUE(l4.f.cached_tokens == 0 || l4.f.cached_tokens == expected_cached(l3, l4.prompt)) << l4.f.cached_tokens;
  std::cout << "[ SWA  ] continued long prompt: " << l4.f.cached_tokens << " of " << l4.prompt.size() << " cached\n";
  expect_same_output(l4, run(plain, more), "long, continued");
}

TEST(PromptCacheEngine, DynamicRopeTurnsTheCacheOff) {
  ModelEngine e(options(golden_model("rope_dynamic"), -1));
  EXPECT_EQ(e.prompt_cache(), nullptr);
  auto r = completion("hello world twice", 4);
  run(e, r);
  EXPECT_EQ(run(e, r).f.cached_tokens, 0);
}

TEST(PromptCacheEngine, TtftWithALongCachedPrefixAndTheUsageField) {
  ModelEngineOptions oc = options(golden_model("llama_mha"), -1), op = options(golden_model("llama_mha"), 0);
  oc.context_length = op.context_length = 4096;  // past the tiny model's 256 positions, on purpose
  oc.allow_long_context = op.allow_long_context = true;
  ModelEngine cached(oc), plain(op);
  const std::string base = text_of_at_least(plain, 2000, "long context ");
  run(cached, completion(base + "first", 4));
  Outcome c = run(cached, completion(base + "second question", 4));
  Outcome p = run(plain, completion(base + "second question", 4));
  EXPECT_GE(c.f.cached_tokens, 1995);
  expect_same_output(c, p, "long prefix");
  std::cout << "[ TTFT ] prompt " << c.prompt.size() << " tokens, " << c.f.cached_tokens << " cached: "
            << c.ttft_s * 1e3 << " ms cached vs " << p.ttft_s * 1e3 << " ms uncached\n";

  // Through HTTP: usage.prompt_tokens_details.cached_tokens.
  ServerOptions so;
  so.port = 0;
  Server server(cached, so);
  const int port = server.bind();
  std::thread t([&] { server.serve(); });
  httplib::Client cl("127.0.0.1", port);
  cl.set_read_timeout(60, 0);
  J body = {{"prompt", base + "second question"}, {"max_tokens", 4}, {"temperature", 0}};
  auto r = cl.Post("/v1/completions", body.dump(), "application/json");
  server.stop();
  t.join();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  J u = J::parse(r->body)["usage"];
  EXPECT_EQ(u["prompt_tokens"].get<int64_t>(), static_cast<int64_t>(c.prompt.size()));
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), static_cast<int64_t>(c.prompt.size()) - 1);
}

}  // namespace
}  // namespace hearth::server

namespace hearth::server {
namespace {

// A hybrid model (Qwen3.5: recurrent states that cannot be trimmed) keeps snapshots every N tokens
// of a prompt: a second prompt sharing only part of the first resumes from the last multiple of N
// inside the shared part (without them: from nothing), and answers as an engine without a cache.
TEST(PromptCacheEngine, AHybridModelResumesFromTheLastSnapshotInsideTheSharedPrefix) {
  const fs::path dir = fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/qwen3_5/q35_tied_hv2";
  ModelEngineOptions every32 = options(dir, -1), ends_only = options(dir, -1);
  every32.prompt_cache_snapshot_every = 32;
  ends_only.prompt_cache_snapshot_every = 0;
  ModelEngine cached(every32), coarse(ends_only), plain(options(dir, 0));
  const std::string base = text_of_at_least(plain, 100, "the fox ");
  auto a = completion(base + "jumps over the dog"), b = completion(base + "sleeps in a barn");
  Outcome a1 = run(cached, a), b1 = run(cached, b);
  EXPECT_EQ(a1.f.cached_tokens, 0);
  const int64_t shared = std::min<int64_t>(lcp(a1.prompt, b1.prompt), static_cast<int64_t>(b1.prompt.size()) - 1);
  ASSERT_GE(shared, 96);
  EXPECT_EQ(b1.f.cached_tokens, shared / 32 * 32);
  Outcome ref = run(plain, b);
  EXPECT_EQ(b1.ids, ref.ids);
  ASSERT_EQ(b1.logprobs.size(), ref.logprobs.size());
  // Prefill in 32-token pieces vs one piece: the chunked delta rule rounds differently in fp32
  // (qwen3_5_parity_test.cpp: up to 2.4e-4 on these random models).
  for (size_t i = 0; i < ref.logprobs.size(); ++i) EXPECT_NEAR(b1.logprobs[i], ref.logprobs[i], 5e-4) << "step " << i;
  // Without the every-N snapshots only whole earlier prompts are resumable: nothing here.
  run(coarse, a);
  EXPECT_EQ(run(coarse, b).f.cached_tokens, 0);
  // The whole first prompt again: from the last multiple of 32 below its end (one token must run).
  EXPECT_EQ(run(cached, a).f.cached_tokens, (static_cast<int64_t>(a1.prompt.size()) - 1) / 32 * 32);
}

}  // namespace
}  // namespace hearth::server
