// The prompt cache with untrimmable (recurrent) layers: entries are snapshots, usable only whole,
// handed out as copies while they stay cached; the longest usable one wins; and on a tiny Qwen3.5
// hybrid a chat turn that resumes from the previous turn's snapshot generates exactly what a cold
// run does, reporting the snapshot's length as cached_tokens.
#include <gtest/gtest.h>

#include <filesystem>

#include "cache/prompt_cache.h"
#include "cache/recurrent_cache.h"
#include "generate/generate.h"
#include "models/registry.h"
#include "test_paths.h"

namespace hearth::cache {
namespace {

// One KV layer and one recurrent layer holding `n` tokens (a hybrid's cache list).
Caches hybrid(int64_t n) {
  Caches c;
  c.push_back(std::make_unique<KVCache>(8));
  c.push_back(std::make_unique<RecurrentCache>());
  auto* kv = static_cast<KVCache*>(c[0].get());
  for (int64_t i = 0; i < n; ++i) kv->update(at::full({1, 1, 1, 4}, float(i)), at::full({1, 1, 1, 4}, float(i)));
  static_cast<RecurrentCache*>(c[1].get())
      ->update(at::full({1, 6, 3}, float(n)), at::full({1, 2, 4, 4}, float(n)), n);
  return c;
}
Caches plain(int64_t n) {
  Caches c;
  c.push_back(std::make_unique<KVCache>(8));
  for (int64_t i = 0; i < n; ++i)
    static_cast<KVCache*>(c[0].get())->update(at::full({1, 1, 1, 4}, float(i)), at::full({1, 1, 1, 4}, float(i)));
  return c;
}
std::vector<int64_t> iota(int64_t n, int64_t from = 0) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = from + i;
  return v;
}

TEST(HybridPromptCache, SnapshotsAreUsedWholeByCopyAndStay) {
  PromptCache pc(1 << 20);
  pc.put("", iota(10), hybrid(10));
  pc.put("", iota(4), hybrid(4));
  PromptCacheHit hit = pc.take("", iota(12));
  EXPECT_EQ(hit.cached, 10);
  ASSERT_EQ(hit.caches.size(), 2u);
  EXPECT_EQ(offset_of(hit.caches), 10);
  EXPECT_EQ(pc.stats().entries, 2);  // the snapshot stays
  // The copy is independent: advancing it leaves the cached snapshot as it was.
  static_cast<RecurrentCache*>(hit.caches[1].get())->update(at::zeros({1, 6, 3}), at::zeros({1, 2, 4, 4}), 1);
  PromptCacheHit again = pc.take("", iota(12));
  EXPECT_EQ(again.cached, 10);
  auto* rc = static_cast<RecurrentCache*>(again.caches[1].get());
  EXPECT_EQ(rc->offset(), 10);
  EXPECT_EQ(rc->recurrent_state().max().item<float>(), 10.0f);
  // Sharing only 8 of the 10-token snapshot: it cannot be trimmed, so the 4-token one is used.
  std::vector<int64_t> diverging = iota(8);
  diverging.push_back(99);
  EXPECT_EQ(pc.take("", diverging).cached, 4);
  // The identical 10-token prompt is capped at 9: only the 4-token snapshot fits.
  EXPECT_EQ(pc.take("", iota(10)).cached, 4);
  EXPECT_EQ(pc.take("", {50, 51, 52}).cached, 0);
  EXPECT_EQ(pc.stats().entries, 2);
  EXPECT_EQ(pc.stats().hits, 4);
  EXPECT_EQ(pc.stats().misses, 1);
}

TEST(HybridPromptCache, LongestUsableEntryWinsAndSameTokensAreReplaced) {
  PromptCache pc(1 << 20);
  pc.put("", iota(7), plain(7));     // trimmable: usable at any shared length
  pc.put("", iota(5), hybrid(5));    // snapshot: only whole
  pc.put("", iota(30), hybrid(30));  // snapshot longer than the shared part: unusable here
  std::vector<int64_t> prompt = iota(20);
  prompt.push_back(7);
  EXPECT_EQ(pc.take("", prompt).cached, 7);  // the plain entry (trimmed to 7) beats the 5 snapshot
  EXPECT_EQ(pc.stats().entries, 2);                         // the plain entry was handed out
  EXPECT_EQ(pc.take("", prompt).cached, 5);
  const int64_t bytes = pc.stats().bytes;
  pc.put("", iota(5), hybrid(5));  // the same tokens again: replaced, not duplicated
  EXPECT_EQ(pc.stats().entries, 2);
  EXPECT_EQ(pc.stats().bytes, bytes);
}

// A two-turn chat on a tiny Qwen3.5 hybrid: turn 2's prompt = turn 1's prompt + answer + more.
TEST(HybridPromptCache, ResumingFromASnapshotEqualsAColdRun) {
  const auto dir = std::filesystem::path(HEARTH_SOURCE_DIR) / "tests/golden/models/qwen3_5/q35_tied_hv2";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no golden " << dir;
  auto model = models::load_model(dir, {at::kCPU, at::kFloat});
  generate::GenerateOptions o;
  o.max_tokens = 10;
  o.sampling.temperature = 0.0;
  o.logprobs = true;
  std::vector<int64_t> turn1;
  for (int i = 0; i < 30; ++i) turn1.push_back((i * 37 + 11) % 500 + 3);
  PromptCache pc(1 << 26);
  Caches caches = pc.take("", turn1).caches;
  EXPECT_TRUE(caches.empty());
  auto r1 = generate::generate(*model, turn1, o, caches, generate::StepCallback{});
  // What the server's engine stores: the tokens the caches hold.
  std::vector<int64_t> history = turn1;
  history.insert(history.end(), r1.tokens.begin(), r1.tokens.end());
  history.resize(static_cast<size_t>(offset_of(caches)));
  const int64_t held = static_cast<int64_t>(history.size());
  pc.put("", history, std::move(caches));

  std::vector<int64_t> turn2 = history;
  for (int i = 0; i < 70; ++i) turn2.push_back((i * 53 + 5) % 500 + 3);  // > one 64-token chunk
  std::vector<at::Tensor> lp_cold, lp_warm;
  auto cold = generate::generate(*model, turn2, o, [&](int64_t, const hearth::generate::StepLogprobs* lp) {
    lp_cold.push_back(lp ? lp->all.clone() : at::Tensor());
    return true;
  });
  PromptCacheHit hit = pc.take("", turn2);
  EXPECT_EQ(hit.cached, held);
  auto warm = generate::generate(*model, turn2, o, hit.caches, [&](int64_t, const hearth::generate::StepLogprobs* lp) {
    lp_warm.push_back(lp ? lp->all.clone() : at::Tensor());
    return true;
  });
  EXPECT_EQ(warm.stats.cached_tokens, held);
  EXPECT_EQ(warm.tokens, cold.tokens);
  ASSERT_EQ(lp_warm.size(), lp_cold.size());
  for (size_t i = 0; i < lp_cold.size(); ++i)
    EXPECT_LT((lp_warm[i] - lp_cold[i]).abs().max().item<double>(), 1e-4) << "step " << i;
}

}  // namespace
}  // namespace hearth::cache
