// KV caches: decoding token by token through the cache gives the full forward's logits
// (fp32, 1e-5), chunked prefill equals one prefill, sliding-window layers through the rotating
// cache equal the full forward with a window mask, trim and memory accounting.
#include "cache/kv_cache.h"

#include <gtest/gtest.h>

#include "../models/random_llama.h"

using hearth::testing::random_llama;
using hearth::testing::tiny_llama_config;

namespace {

at::Tensor ids_of(int64_t T, int64_t V, uint64_t seed) {
  at::manual_seed(seed);
  return at::randint(V, {1, T}, at::TensorOptions().dtype(at::kLong));
}

// Full forward (no cache) vs prefill `split` tokens then one token at a time through the cache.
double cached_vs_full(hearth::models::Model& m, const at::Tensor& ids, int64_t split) {
  at::Tensor full = m.forward(ids, 0, nullptr);
  auto caches = m.make_cache();
  std::vector<at::Tensor> parts{m.forward(ids.narrow(1, 0, split), 0, &caches)};
  for (int64_t t = split; t < ids.size(1); ++t) parts.push_back(m.forward(ids.narrow(1, t, 1), t, &caches));
  return (at::cat(parts, 1) - full).abs().max().item<double>();
}

}  // namespace

TEST(KVCache, DecodeMatchesFullForward) {
  for (auto patch : {nlohmann::json::object(), nlohmann::json{{"num_key_value_heads", 1}},
                     nlohmann::json{{"model_type", "qwen3"}, {"head_dim", 16}},
                     nlohmann::json{{"model_type", "qwen2"}, {"tie_word_embeddings", true}}}) {
    auto m = random_llama(tiny_llama_config(patch));
    auto ids = ids_of(24, 64, 5);
    EXPECT_LT(cached_vs_full(*m, ids, 7), 1e-5) << patch.dump();
    EXPECT_LT(cached_vs_full(*m, ids, 1), 1e-5) << patch.dump();
  }
}

TEST(KVCache, ChunkedPrefillMatchesSinglePrefill) {
  auto m = random_llama(tiny_llama_config());
  auto ids = ids_of(300, 64, 6);  // > one 256-token cache step: exercises growth
  auto caches = m->make_cache();
  at::Tensor single = m->forward(ids, 0, &caches);
  auto chunked_caches = m->make_cache();
  std::vector<at::Tensor> parts;
  for (int64_t o = 0; o < 300; o += 64) {
    const int64_t len = std::min<int64_t>(64, 300 - o);
    parts.push_back(m->forward(ids.narrow(1, o, len), o, &chunked_caches));
  }
  EXPECT_LT((at::cat(parts, 1) - single).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(chunked_caches[0]->offset(), 300);
  // 2 KV heads · head_dim 8 · fp32 · (keys + values) · capacity 512 (two 256 steps).
  EXPECT_EQ(chunked_caches[0]->nbytes(), int64_t{2} * 8 * 4 * 2 * 512);
  EXPECT_EQ(hearth::cache::total_bytes(chunked_caches), 2 * chunked_caches[0]->nbytes());
}

TEST(KVCache, SlidingWindowThroughRotatingCache) {
  // Mistral with window 5: the rotating cache keeps ~4 past tokens, yet every step must equal
  // the full forward, whose mask limits each query to the last 5 positions.
  auto m = random_llama(tiny_llama_config({{"model_type", "mistral"}, {"sliding_window", 5}}));
  auto caches = m->make_cache();
  ASSERT_EQ(caches[0]->kind(), "rotating_kv");
  auto ids = ids_of(40, 64, 7);
  EXPECT_LT(cached_vs_full(*m, ids, 9), 1e-5);
  // And the window matters: a model without it gives different logits.
  auto no_window = random_llama(tiny_llama_config({{"model_type", "mistral"}, {"sliding_window", nullptr}}));
  EXPECT_GT((no_window->forward(ids, 0, nullptr) - m->forward(ids, 0, nullptr)).abs().max().item<double>(), 1e-3);
}

TEST(KVCache, RotatingCacheBoundsMemoryAndTrims) {
  hearth::cache::RotatingKVCache c(4, /*step=*/8);
  auto kv = [](int64_t T, float base) { return at::arange(T, at::kFloat).add(base).view({1, 1, T, 1}); };
  for (int i = 0; i < 30; ++i) {
    auto view = c.update(kv(1, i), kv(1, i));
    // The newest key is the token just added, at absolute position pos0 + S - 1 == i.
    EXPECT_EQ(view.pos0 + view.keys.size(2) - 1, i);
    EXPECT_EQ(view.keys[0][0][-1][0].item<float>(), float(i));
    EXPECT_GE(view.keys.size(2), std::min(4, i + 1));  // the whole window is present
  }
  EXPECT_LE(c.nbytes(), 2 * 8 * 4);  // capacity stays one step
  // Older tokens are gone: trimming stops where the next query would miss part of its window.
  const int64_t t = c.trim(10);
  EXPECT_LT(t, 10);
  EXPECT_EQ(c.offset(), 30 - t);
  EXPECT_EQ(c.start(), c.offset() - 3);  // exactly window-1 tokens left
  hearth::cache::KVCache full;
  full.update(kv(5, 0), kv(5, 0));
  EXPECT_EQ(full.trim(2), 2);
  EXPECT_EQ(full.offset(), 3);
  auto view = full.update(kv(1, 100), kv(1, 100));
  EXPECT_EQ(view.keys.size(2), 4);
  EXPECT_EQ(view.keys[0][0][3][0].item<float>(), 100.f);
}

// RowsCache::group: rows of a ragged view at one offset, appended as one batch, each into its own
// cache, read back side by side; other kinds or offsets are not groupable.
TEST(KVCache, RowsGroupAppendsEachRowToItsOwnCache) {
  using namespace hearth::cache;
  at::manual_seed(3);
  KVCache a, b, c;
  RotatingKVCache r(4);
  const at::Tensor past = at::randn({3, 2, 2, 4});
  a.update(past[0].unsqueeze(0), past[0].unsqueeze(0));
  b.update(past[1].unsqueeze(0), past[1].unsqueeze(0));
  c.update(past[2].unsqueeze(0).narrow(2, 0, 1), past[2].unsqueeze(0).narrow(2, 0, 1));  // offset 1
  r.update(past[0].unsqueeze(0), past[0].unsqueeze(0));
  RowsCache rows({&a, &b, &c, &r});
  EXPECT_TRUE(grouped_kv(&rows, 0, 2));
  EXPECT_FALSE(grouped_kv(&rows, 1, 2));  // offsets 2 and 1
  EXPECT_FALSE(grouped_kv(&rows, 2, 2));  // a sliding-window cache
  EXPECT_FALSE(grouped_kv(&rows, 3, 2));  // past the rows
  EXPECT_THROW(rows.group(1, 2), hearth::Error);
  const at::Tensor k = at::randn({2, 2, 3, 4}), v = at::randn({2, 2, 3, 4});
  KVCacheBase* g = rows.group(0, 2);
  EXPECT_EQ(rows.group(0, 2), g);  // made once
  EXPECT_EQ(g->offset(), 2);
  KVView view = g->update(k, v);
  EXPECT_EQ(a.offset(), 5);
  EXPECT_EQ(b.offset(), 5);
  EXPECT_EQ(view.keys.sizes(), (std::vector<int64_t>{2, 2, 5, 4}));
  EXPECT_TRUE(at::equal(view.keys[1].narrow(1, 0, 2), past[1]));
  EXPECT_TRUE(at::equal(view.keys[1].narrow(1, 2, 3), k[1]));
  EXPECT_TRUE(at::equal(view.values[0].narrow(1, 2, 3), v[0]));
  EXPECT_TRUE(at::equal(a.keys_buffer().narrow(2, 2, 3)[0], k[0]));
  EXPECT_THROW(g->update(k.narrow(0, 0, 1), v.narrow(0, 0, 1)), hearth::Error);  // one row for a group of two
}
