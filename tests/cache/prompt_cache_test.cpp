// PromptCache on real KVCache/RotatingKVCache layers (CPU): longest-common-prefix choice per
// namespace, the length-1 cap, a lone shared token a miss, exact trim or miss for sliding windows, LRU eviction by bytes,
// drop_if; and generate::generate over a pre-filled cache against a fresh run on a tiny model.
#include <gtest/gtest.h>

#include "../adapters/lora_test_util.h"
#include "cache/prompt_cache.h"
#include "generate/generate.h"

namespace hearth::cache {
namespace {

// Two layers of KVCache holding `n` tokens of [1, 1, n, 4] fp32 (16 bytes per token per tensor).
Caches filled(int64_t n, bool rotating = false, int64_t window = 4, int64_t step = 8) {
  Caches c;
  for (int l = 0; l < 2; ++l) {
    if (rotating) c.push_back(std::make_unique<RotatingKVCache>(window, step));
    else c.push_back(std::make_unique<KVCache>(step));
    auto* kv = static_cast<KVCacheBase*>(c.back().get());
    for (int64_t i = 0; i < n; ++i) kv->update(at::full({1, 1, 1, 4}, float(i)), at::full({1, 1, 1, 4}, float(i)));
  }
  return c;
}
std::vector<int64_t> iota_prompt(int64_t n, int64_t from = 0) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = from + i;
  return v;
}

TEST(PromptCache, TakesTheLongestCommonPrefixOfTheSameNamespaceAndTrimsToIt) {
  PromptCache pc(1 << 20);
  pc.put("", iota_prompt(10), filled(10));
  std::vector<int64_t> other = iota_prompt(6);
  other.push_back(99);
  pc.put("", other, filled(7));
  pc.put("a", iota_prompt(20), filled(20));  // another adapter selection: never used for ""
  std::vector<int64_t> prompt = iota_prompt(8);
  prompt.push_back(42);  // shares 8 with the first entry, 6 with the second, 9 with "a"'s
  PromptCacheHit hit = pc.take("", prompt);
  EXPECT_EQ(hit.cached, 8);
  ASSERT_EQ(hit.caches.size(), 2u);
  for (const auto& c : hit.caches) EXPECT_EQ(c->offset(), 8);
  // The entry was handed out: 2 left, and the next take of the same prompt uses the 6-token one.
  EXPECT_EQ(pc.stats().entries, 2);
  EXPECT_EQ(pc.take("", prompt).cached, 6);
  EXPECT_EQ(pc.take("", prompt).cached, 0);  // only "a" is left
  EXPECT_EQ(pc.take("b", prompt).cached, 0);
  EXPECT_EQ(pc.take("a", prompt).cached, 8);
  EXPECT_EQ(pc.stats().hits, 3);
  EXPECT_EQ(pc.stats().misses, 2);
}

// A lone shared first token (a BOS every prompt starts with) is a miss that leaves the entries in
// place: a request without an entry of its own does not take one that its owner continues.
TEST(PromptCache, OneSharedTokenIsAMissThatKeepsTheEntry) {
  PromptCache pc(1 << 20);
  pc.put("", {1, 5, 6, 7}, filled(4));
  pc.put("", {1, 8, 9}, filled(3));
  EXPECT_EQ(pc.take("", {1, 2, 3}).cached, 0);
  EXPECT_EQ(pc.stats().entries, 2);
  EXPECT_EQ(pc.stats().misses, 1);
  EXPECT_EQ(pc.take("", {1, 5, 6, 9}).cached, 3);  // its owner still finds it
  EXPECT_EQ(pc.take("", {1, 8, 4}).cached, 2);
  EXPECT_EQ(pc.stats().entries, 0);
}

TEST(PromptCache, AnIdenticalPromptReusesAllButItsLastToken) {
  PromptCache pc(1 << 20);
  pc.put("", iota_prompt(12), filled(12));
  PromptCacheHit hit = pc.take("", iota_prompt(12));
  EXPECT_EQ(hit.cached, 11);
  EXPECT_EQ(hit.caches[1]->offset(), 11);
  pc.put("", iota_prompt(1), filled(1));
  EXPECT_EQ(pc.take("", iota_prompt(1)).cached, 0);  // nothing can be reused from a 1-token prompt
}

TEST(PromptCache, EvictsTheLeastRecentlyUsedEntriesByBytes) {
  // filled(n) with step 8: capacity rounds up to 8 tokens → 2 layers × 2 tensors × 8 × 16 B = 512 B.
  ASSERT_EQ(total_bytes(filled(5)), 512);
  PromptCache pc(1100);  // two such entries fit, three do not
  pc.put("", iota_prompt(5, 0), filled(5));
  pc.put("", iota_prompt(5, 100), filled(5));
  EXPECT_EQ(pc.stats().bytes, 1024);
  pc.put("", iota_prompt(5, 200), filled(5));
  EXPECT_EQ(pc.stats().entries, 2);
  EXPECT_EQ(pc.stats().bytes, 1024);
  EXPECT_EQ(pc.take("", iota_prompt(6, 0)).cached, 0);    // the oldest went
  EXPECT_EQ(pc.take("", iota_prompt(6, 100)).cached, 5);  // the others stayed
  EXPECT_EQ(pc.take("", iota_prompt(6, 200)).cached, 5);
  // An entry alone over the budget (capacity 24 tokens: 1536 B) is not stored, nor evicts.
  pc.put("", iota_prompt(5, 300), filled(5));
  pc.put("", iota_prompt(20), filled(20));
  EXPECT_EQ(pc.stats().entries, 1);
  EXPECT_EQ(pc.stats().bytes, 512);
}

TEST(PromptCache, ASlidingWindowThatDroppedTheNeededTokensIsAMiss) {
  // Window 4, step 8: after 20 tokens the buffer has compacted and holds only the recent ones.
  Caches rot = filled(20, /*rotating=*/true);
  ASSERT_GT(static_cast<RotatingKVCache*>(rot[0].get())->start(), 0);
  PromptCache pc(1 << 20);
  pc.put("", iota_prompt(20), std::move(rot));
  std::vector<int64_t> prompt = iota_prompt(5);
  prompt.push_back(77);
  EXPECT_EQ(pc.take("", prompt).cached, 0);  // would need tokens 2..4, long gone
  EXPECT_EQ(pc.stats().entries, 0);          // the half-trimmed entry was discarded
  // Trimming a little (the kept tokens still cover the new position's window) is exact.
  pc.put("", iota_prompt(20), filled(20, true));
  std::vector<int64_t> longer = iota_prompt(19);
  longer.push_back(77);
  PromptCacheHit hit = pc.take("", longer);
  EXPECT_EQ(hit.cached, 19);
  EXPECT_EQ(hit.caches[0]->offset(), 19);
}

// A hit trimmed far back holds no more than a fresh prefill of its tokens would (the server charges
// a request by its own length, not by the longer one that grew the buffers), and keeps its tokens.
TEST(PromptCache, AHitTrimmedFarBackIsShrunkToItsTokens) {
  PromptCache pc(1 << 20);
  pc.put("", iota_prompt(40), filled(40));  // step 8: buffers of 40 tokens, 16 bytes each per tensor
  std::vector<int64_t> prompt = iota_prompt(10);
  prompt.push_back(99);
  PromptCacheHit hit = pc.take("", prompt);
  ASSERT_EQ(hit.cached, 10);
  auto* kv = static_cast<KVCache*>(hit.caches[0].get());
  EXPECT_EQ(kv->capacity(), 16);
  EXPECT_EQ(total_bytes(hit.caches), 2 * 2 * 16 * 16);  // 2 layers x keys and values x 16 tokens x 16 bytes
  EXPECT_TRUE(at::equal(kv->keys_buffer().narrow(2, 0, 10).flatten(), at::arange(10).to(at::kFloat).repeat_interleave(4)));
  // A sliding window whose buffer grew for one long chunk is shrunk alike.
  Caches rot;
  for (int l = 0; l < 2; ++l) {
    rot.push_back(std::make_unique<RotatingKVCache>(4, 8));
    at::Tensor x = at::arange(30).to(at::kFloat).view({1, 1, 30, 1}).expand({1, 1, 30, 4}).contiguous();
    static_cast<RotatingKVCache*>(rot.back().get())->update(x, x);
  }
  pc.put("", iota_prompt(30), std::move(rot));
  PromptCacheHit rhit = pc.take("", prompt);
  ASSERT_EQ(rhit.cached, 10);
  EXPECT_EQ(static_cast<RotatingKVCache*>(rhit.caches[0].get())->capacity(), 16);  // was 32
  EXPECT_EQ(rhit.caches[0]->offset(), 10);
}

TEST(PromptCache, DropIfRemovesMatchingNamespacesAndRejectsInconsistentEntries) {
  PromptCache pc(1 << 20);
  pc.put("a", iota_prompt(3), filled(3));
  pc.put("a+b", iota_prompt(3), filled(3));
  pc.put("c", iota_prompt(3), filled(3));
  pc.drop_if([](const std::string& ns) { return ns.find('a') != std::string::npos; });
  EXPECT_EQ(pc.stats().entries, 1);
  EXPECT_EQ(pc.stats().bytes, total_bytes(filled(3)));
  EXPECT_THROW(pc.put("", iota_prompt(4), filled(3)), Error);
  EXPECT_THROW(PromptCache(0), Error);
}

// generate() over caches already holding a prefix equals a fresh run: the same greedy tokens and
// per-step log-probabilities within 1e-5 (log-softmax of the logits: the same differences).
TEST(PromptCache, GenerateFromAPrefilledPrefixEqualsAFreshRun) {
  for (const char* variant : {"llama_mha", "mistral_swa"}) {
    auto model = hearth::testing::load_tiny(variant);
    std::vector<int64_t> prompt;
    for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 11) % 500 + 3);
    generate::GenerateOptions o;
    o.max_tokens = 12;
    o.logprobs = true;
    o.sampling.temperature = 0.0;
    std::vector<at::Tensor> lp_fresh, lp_cached;
    auto fresh = generate::generate(*model, prompt, o, [&](int64_t, const hearth::generate::StepLogprobs* lp) {
      lp_fresh.push_back(lp ? lp->all.clone() : at::Tensor());
      return true;
    });
    // Prefill the first 25 tokens (prefill only), then continue from them.
    Caches caches;
    generate::GenerateOptions pre = o;
    pre.max_tokens = 0;
    generate::generate(*model, std::vector<int64_t>(prompt.begin(), prompt.begin() + 25), pre, caches,
                       generate::StepCallback{});
    ASSERT_EQ(caches.front()->offset(), 25);
    auto cached = generate::generate(*model, prompt, o, caches, [&](int64_t, const hearth::generate::StepLogprobs* lp) {
      lp_cached.push_back(lp ? lp->all.clone() : at::Tensor());
      return true;
    });
    EXPECT_EQ(cached.stats.cached_tokens, 25);
    EXPECT_EQ(cached.tokens, fresh.tokens) << variant;
    ASSERT_EQ(lp_cached.size(), lp_fresh.size());
    for (size_t i = 0; i < lp_fresh.size(); ++i)
      EXPECT_LT((lp_cached[i] - lp_fresh[i]).abs().max().item<double>(), 1e-5) << variant << " step " << i;
    // The caches now hold the prompt and the fed-back generated tokens (all but the last).
    EXPECT_EQ(caches.front()->offset(), 40 + 12 - 1);
    // A prefix as long as the prompt is refused (nothing left to prefill).
    EXPECT_THROW(generate::generate(*model, std::vector<int64_t>(prompt.begin(), prompt.begin() + 10), o, caches,
                                    generate::StepCallback{}),
                 Error);
  }
}

}  // namespace
}  // namespace hearth::cache
