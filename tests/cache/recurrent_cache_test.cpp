// The typed cache seam: RecurrentCache (state of a linear-attention layer: update, no trim,
// deep clone), and the per-model helpers offset_of / clone / trim_all over a mix of kinds with
// null entries (layers without a cache of their own, e.g. Gemma 4's KV-sharing layers).
#include "cache/recurrent_cache.h"

#include <gtest/gtest.h>

#include "cache/prompt_cache.h"
#include "core/error.h"

namespace hearth::cache {
namespace {

void feed_kv(LayerCache& c, int64_t n) {
  auto& kv = dynamic_cast<KVCacheBase&>(c);
  for (int64_t i = 0; i < n; ++i) kv.update(at::full({1, 1, 1, 4}, float(i)), at::full({1, 1, 1, 4}, float(-i)));
}

// A hybrid stack: KV, null (shares), recurrent, each holding `n` tokens.
Caches hybrid_recurrent(int64_t n) {
  Caches c;
  c.push_back(std::make_unique<KVCache>(8));
  feed_kv(*c.back(), n);
  c.push_back(nullptr);
  auto rc = std::make_unique<RecurrentCache>();
  rc->update(at::full({1, 6, 3}, float(n)), at::full({1, 2, 4, 4}, float(n)), n);
  c.push_back(std::move(rc));
  return c;
}

}  // namespace

TEST(RecurrentCache, UpdateReplacesStatesAndCountsTokens) {
  RecurrentCache c;
  EXPECT_EQ(c.offset(), 0);
  EXPECT_EQ(c.nbytes(), 0);
  c.update(at::zeros({2, 6, 3}), at::ones({2, 3, 4, 5}), 7);
  c.update(at::ones({2, 6, 3}), at::full({2, 3, 4, 5}, 2.0f), 1);
  EXPECT_EQ(c.offset(), 8);
  EXPECT_EQ(c.nbytes(), (2 * 6 * 3 + 2 * 3 * 4 * 5) * 4);
  EXPECT_EQ(c.recurrent_state().sum().item<float>(), 2.0f * 120);
  EXPECT_EQ(c.kind(), "recurrent");
}

TEST(RecurrentCache, RefusesNonFloat32StateAndShapeChanges) {
  RecurrentCache c;
  EXPECT_THROW(c.update(at::zeros({1, 6, 3}), at::zeros({1, 2, 4, 4}, at::kDouble), 1), Error);
  c.update(at::zeros({1, 6, 3}), at::zeros({1, 2, 4, 4}), 1);
  EXPECT_THROW(c.update(at::zeros({2, 6, 3}), at::zeros({2, 2, 4, 4}), 1), Error);
  EXPECT_THROW(c.update(at::zeros({1, 6, 3}), at::zeros({1, 2, 4, 4}), -1), Error);
}

TEST(RecurrentCache, CannotTrimButClonesDeeply) {
  RecurrentCache c;
  c.update(at::zeros({1, 6, 3}), at::zeros({1, 2, 4, 4}), 5);
  EXPECT_EQ(c.trim(2), 0);
  EXPECT_EQ(c.trim(0), 0);
  EXPECT_EQ(c.offset(), 5);
  auto snap = c.clone();
  c.update(at::ones({1, 6, 3}), at::ones({1, 2, 4, 4}), 1);
  auto* s = dynamic_cast<RecurrentCache*>(snap.get());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->offset(), 5);
  EXPECT_EQ(s->recurrent_state().abs().sum().item<float>(), 0.0f);  // the snapshot did not move on
}

TEST(Caches, OffsetCloneAndTrimOverMixedKindsWithNullEntries) {
  Caches c = hybrid_recurrent(6);
  EXPECT_EQ(offset_of(c), 6);
  EXPECT_EQ(total_bytes(c), 2 * 8 * 4 * 4 + (6 * 3 + 2 * 4 * 4) * 4);
  Caches snap = clone(c);
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_EQ(snap[1], nullptr);
  feed_kv(*c[0], 1);  // the original moves on, the KV layer only: now inconsistent
  EXPECT_THROW(offset_of(c), Error);
  EXPECT_EQ(offset_of(snap), 6);
  EXPECT_TRUE(trim_all(snap, 0));
  EXPECT_FALSE(trim_all(snap, 2));  // the recurrent layer cannot go back
  Caches kv_only;
  kv_only.push_back(std::make_unique<KVCache>(8));
  feed_kv(*kv_only[0], 4);
  kv_only.push_back(nullptr);
  EXPECT_TRUE(trim_all(kv_only, 3));
  EXPECT_EQ(offset_of(kv_only), 1);
  EXPECT_EQ(offset_of(Caches{}), 0);
}

TEST(Caches, KVCloneIsIndependentOfTheOriginal) {
  KVCache c(4);
  feed_kv(c, 3);
  auto snap = c.clone();
  c.trim(1);
  c.update(at::full({1, 1, 1, 4}, 7.0f), at::full({1, 1, 1, 4}, 7.0f));  // overwrites slot 2 of the original
  auto& s = dynamic_cast<KVCache&>(*snap);
  EXPECT_EQ(s.offset(), 3);
  KVView v = s.update(at::full({1, 1, 1, 4}, 9.0f), at::full({1, 1, 1, 4}, 9.0f));
  EXPECT_EQ(v.keys.size(2), 4);
  EXPECT_EQ(v.keys[0][0][2][0].item<float>(), 2.0f);
  EXPECT_EQ(v.values[0][0][2][0].item<float>(), -2.0f);
  RotatingKVCache r(3, 4);
  feed_kv(r, 5);
  auto rs = r.clone();
  EXPECT_EQ(rs->offset(), 5);
  EXPECT_EQ(dynamic_cast<RotatingKVCache&>(*rs).start(), r.start());
}

TEST(PromptCache, EntriesWithNullLayersAreStoredAndTrimmed) {
  PromptCache pc(1 << 20);
  Caches c;
  c.push_back(std::make_unique<KVCache>(8));
  feed_kv(*c[0], 5);
  c.push_back(nullptr);
  pc.put("", {1, 2, 3, 4, 5}, std::move(c));
  PromptCacheHit hit = pc.take("", {1, 2, 3, 9});
  EXPECT_EQ(hit.cached, 3);
  ASSERT_EQ(hit.caches.size(), 2u);
  EXPECT_EQ(hit.caches[0]->offset(), 3);
  EXPECT_EQ(hit.caches[1], nullptr);
}

}  // namespace hearth::cache
