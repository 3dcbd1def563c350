// Decode slots (generate/decode_slots.h) for Gemma 4 on CPU fp32 with the tiny golden models:
// sliding-window layers held in the slot by absolute position under each row's own window mask,
// KV-sharing layers without slot storage. Sequences of different prompt lengths (shorter and
// longer than the window) decoded together in slots give each one's eager greedy tokens; caches
// read back from a slot equal the eager loop's and carry on (ragged path, slots, prompt-cache hit);
// the pool's bytes are DecodeSlots::slot_bytes per slot.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <typeinfo>

#include "core/error.h"
#include "generate/batch.h"
#include "generate/decode_slots.h"
#include "models/gemma4/gemma4.h"
#include "models/registry.h"
#include "test_paths.h"

namespace hearth::generate {
namespace {

const std::filesystem::path kG4SlotDir = std::filesystem::path(HEARTH_SOURCE_DIR) / "tests/golden/models";

struct G4SlotTrace {
  std::vector<int64_t> tokens;
  std::vector<at::Tensor> logprobs;
  bool static_decode = false;
};

std::vector<int64_t> g4slot_prompt(int64_t len, int64_t seed) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back((seed * 31 + i * 17 + 5) % 250 + 2);
  return p;
}

GenerateOptions g4slot_options(int64_t max_tokens) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.logprobs = true;
  o.prefill_step_size = 8;
  return o;
}

std::unique_ptr<models::Model> g4slot_model(const char* variant) {
  unsetenv("HEARTH_STATIC_DECODE");  // the reference is the eager loop
  unsetenv("HEARTH_CUDA_GRAPHS");
  return models::load_model(kG4SlotDir / variant, {at::kCPU, at::kFloat});
}

G4SlotTrace g4slot_alone(models::Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& o,
                         cache::Caches* caches = nullptr) {
  G4SlotTrace r;
  cache::Caches own;
  GenerationResult res = generate(model, prompt, o, caches ? *caches : own, [&](int64_t, const StepLogprobs* lp) {
    r.logprobs.push_back(lp ? lp->all.clone() : at::Tensor());
    return true;
  });
  r.tokens = res.tokens;
  r.static_decode = res.stats.static_decode;
  return r;
}

// Runs the sequences through step() with `slots`, sequence i joining at step joins[i]. *most = the
// most slots occupied at once; *slotted_steps[i] = the steps sequence i spent in a slot.
std::vector<G4SlotTrace> g4slot_batched(models::Model& model, DecodeSlots* slots,
                                        const std::vector<std::vector<int64_t>>& prompts,
                                        const std::vector<GenerateOptions>& opts, const std::vector<int>& joins,
                                        int64_t* most, std::vector<int64_t>* slotted_steps) {
  std::vector<G4SlotTrace> runs(prompts.size());
  std::vector<std::unique_ptr<Sequence>> seqs(prompts.size());
  slotted_steps->assign(prompts.size(), 0);
  *most = 0;
  for (int step_no = 0;; ++step_no) {
    for (size_t i = 0; i < prompts.size(); ++i)
      if (!seqs[i] && joins[i] <= step_no)
        seqs[i] = std::make_unique<Sequence>(prompts[i], opts[i], cache::Caches{}, std::vector<std::string>{},
                                             [&runs, i](int64_t, const StepLogprobs* lp) {
                                               runs[i].logprobs.push_back(lp ? lp->all.clone() : at::Tensor());
                                               return true;
                                             });
    std::vector<Sequence*> live;
    for (auto& s : seqs)
      if (s && !s->done()) live.push_back(s.get());
    const bool all_started = std::all_of(seqs.begin(), seqs.end(), [](const auto& s) { return s != nullptr; });
    if (live.empty() && all_started) break;
    if (!live.empty()) step(model, live, 64, slots);
    *most = std::max(*most, slots->occupied());
    for (size_t i = 0; i < seqs.size(); ++i)
      if (seqs[i] && seqs[i]->in_slot()) ++(*slotted_steps)[i];
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    runs[i].tokens = seqs[i]->result().tokens;
    runs[i].static_decode = seqs[i]->result().stats.static_decode;
  }
  return runs;
}

// The tokens a RotatingKVCache holds, read through a zero-token update of a copy.
cache::KVView g4slot_held(const cache::RotatingKVCache& rc, int64_t H, int64_t D) {
  auto copy = rc.clone();
  at::Tensor none = at::zeros({1, H, 0, D});
  return static_cast<cache::RotatingKVCache&>(*copy).update(none, none);
}

// `got` holds what `want` (the eager loop's caches) holds: same kinds and offset, null for the
// sharers, every KV layer's tokens, every sliding layer's last window-1 tokens (all a next query
// sees) at the same positions.
void g4slot_expect_same_caches(const models::gemma4::Gemma4Config& cfg, cache::Caches& got, cache::Caches& want) {
  ASSERT_EQ(got.size(), want.size());
  const int64_t n = cache::offset_of(want);
  EXPECT_EQ(cache::offset_of(got), n);
  const int64_t W = cfg.sliding_window;
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(!got[i], !want[i]);
    EXPECT_EQ(!got[i], cfg.kv_shared(static_cast<int64_t>(i)));
    if (!got[i]) continue;
    ASSERT_EQ(typeid(*got[i]), typeid(*want[i]));
    if (auto* kv = dynamic_cast<cache::KVCache*>(got[i].get())) {
      auto& ref = dynamic_cast<cache::KVCache&>(*want[i]);
      auto diff = [n](const at::Tensor& a, const at::Tensor& b) {
        return (a.narrow(2, 0, n) - b.narrow(2, 0, n)).abs().max().item<double>();
      };
      EXPECT_LE(diff(kv->keys_buffer(), ref.keys_buffer()), 1e-4);
      EXPECT_LE(diff(kv->values_buffer(), ref.values_buffer()), 1e-4);
      continue;
    }
    auto& sw = dynamic_cast<cache::RotatingKVCache&>(*got[i]);
    auto& ew = dynamic_cast<cache::RotatingKVCache&>(*want[i]);
    EXPECT_EQ(sw.window(), W);
    const int64_t H = cfg.layer_kv_heads(static_cast<int64_t>(i)), D = cfg.layer_head_dim(static_cast<int64_t>(i));
    cache::KVView s = g4slot_held(sw, H, D), e = g4slot_held(ew, H, D);
    const int64_t first = n - (W - 1);
    ASSERT_LE(s.pos0, first);
    ASSERT_LE(e.pos0, first);
    EXPECT_EQ(s.pos0 + s.keys.size(2), n);
    at::Tensor sk = s.keys.narrow(2, first - s.pos0, W - 1), ek = e.keys.narrow(2, first - e.pos0, W - 1);
    at::Tensor sv = s.values.narrow(2, first - s.pos0, W - 1), ev = e.values.narrow(2, first - e.pos0, W - 1);
    EXPECT_LE((sk - ek).abs().max().item<double>(), 1e-4);
    EXPECT_LE((sv - ev).abs().max().item<double>(), 1e-4);
  }
}

TEST(DecodeSlotsGemma4, RowsOfDifferentLengthsEqualEachAloneInSlots) {
  for (const char* variant : {"gemma4_e", "gemma4_keqv", "gemma4_mm"}) {
    SCOPED_TRACE(variant);
    auto model = g4slot_model(variant);
    const auto& cfg = dynamic_cast<models::gemma4::Gemma4Model&>(*model).config();
    const int64_t W = cfg.sliding_window;
    ASSERT_LE(W, 10);  // the prompts below cross the window
    // 3 slots of 160 tokens for 5 sequences: prompts shorter and longer than the window; sequence
    // 1 ends early; sequence 3 waits (ragged) for a free slot; sequence 4 (140 + 40) never fits
    // and decodes through the ragged path; rows cross the 128-token length bucket.
    const std::vector<std::vector<int64_t>> prompts{g4slot_prompt(3, 1), g4slot_prompt(W + 9, 2),
                                                    g4slot_prompt(4 * W + 3, 3), g4slot_prompt(W - 2, 4),
                                                    g4slot_prompt(140, 5)};
    const std::vector<GenerateOptions> opts{g4slot_options(30), g4slot_options(5), g4slot_options(110),
                                            g4slot_options(20), g4slot_options(40)};
    std::vector<G4SlotTrace> want;
    for (size_t i = 0; i < prompts.size(); ++i) want.push_back(g4slot_alone(*model, prompts[i], opts[i]));
    std::string why;
    auto slots = DecodeSlots::create(*model, 3, 160, &why);
    ASSERT_TRUE(slots) << why;
    int64_t most = 0;
    std::vector<int64_t> in_slot;
    auto got = g4slot_batched(*model, slots.get(), prompts, opts, {0, 0, 1, 1, 2}, &most, &in_slot);
    EXPECT_EQ(most, 3);                // they really shared the pool
    EXPECT_EQ(slots->occupied(), 0);   // every ended sequence gave its slot back
    EXPECT_GT(slots->eager_steps(), 0);  // CPU: the slot step, run eagerly
    double worst = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SCOPED_TRACE(i);
      ASSERT_EQ(want[i].tokens.size(), static_cast<size_t>(opts[i].max_tokens));
      EXPECT_FALSE(want[i].static_decode);
      EXPECT_EQ(got[i].tokens, want[i].tokens);
      ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size());
      for (size_t t = 0; t < got[i].logprobs.size(); ++t)
        worst = std::max(worst, (got[i].logprobs[t] - want[i].logprobs[t]).abs().max().item<double>());
      if (i == 4) {
        EXPECT_FALSE(got[i].static_decode);  // 140 + 40 > 160: the ragged path
        EXPECT_EQ(in_slot[i], 0);
      } else {
        EXPECT_TRUE(got[i].static_decode);
        EXPECT_GE(in_slot[i], opts[i].max_tokens / 2);  // decoded in its slot (sequence 3 after a wait)
      }
    }
    // The slot step attends over the padded length bucket under the masks (another summation
    // order than the eager window's keys), fed back through the caches: measured on libtorch 1.13
    // + OpenBLAS (CPU) 7.2e-5 (gemma4_e), 1.6e-4 (gemma4_keqv), 2.5e-4 (gemma4_mm) over up to 110
    // tokens, as the single-sequence static path (StaticDecodeGemma4). A wrong position, window
    // mask or RoPE row is O(1).
    std::cout << "[decode-slots-gemma4] " << variant << ": worst logprob difference " << worst << "\n";
    EXPECT_LE(worst, 1e-3);
  }
}

TEST(DecodeSlotsGemma4, CachesReadBackFromASlotEqualTheEagerOnesAndCarryOn) {
  for (const char* variant : {"gemma4_e", "gemma4_keqv"}) {
    SCOPED_TRACE(variant);
    auto model = g4slot_model(variant);
    const auto& cfg = dynamic_cast<models::gemma4::Gemma4Model&>(*model).config();
    const int64_t W = cfg.sliding_window;
    const std::vector<int64_t> prompt = g4slot_prompt(2 * W + 5, 6);
    const GenerateOptions o = g4slot_options(3 * W);
    cache::Caches eager_caches;
    G4SlotTrace eager = g4slot_alone(*model, prompt, o, &eager_caches);
    auto slots = DecodeSlots::create(*model, 2, 128);
    ASSERT_TRUE(slots);
    EXPECT_EQ(slots->warm_up(/*run_eager=*/true).buckets, 2);  // (1, 128) and (2, 128), garbage rows only
    Sequence seq(prompt, o, {}, {}, {});
    int64_t steps = 0;
    while (!seq.in_slot() || steps < 2 * W + 2) {  // the window is crossed inside the slot
      step(*model, {&seq}, 8, slots.get());
      ++steps;
      ASSERT_FALSE(seq.done());
    }
    // Mid-way (as the prompt cache asks): the caches come back from the slot, which is freed; one
    // step through the ragged path, then back into a slot with the caches read back.
    const int64_t mid = cache::offset_of(seq.caches());
    EXPECT_GE(mid, static_cast<int64_t>(prompt.size()) + W);
    EXPECT_FALSE(seq.in_slot());
    EXPECT_EQ(slots->occupied(), 0);
    step(*model, {&seq}, 8, nullptr);
    step(*model, {&seq}, 8, slots.get());
    EXPECT_TRUE(seq.in_slot());
    while (!seq.done()) step(*model, {&seq}, 8, slots.get());
    EXPECT_FALSE(seq.in_slot());
    EXPECT_TRUE(seq.result().stats.static_decode);
    EXPECT_EQ(seq.result().tokens, eager.tokens);
    // What finish_sequence stores in the prompt cache: the same caches as the eager loop's.
    cache::Caches& got = seq.caches();
    g4slot_expect_same_caches(cfg, got, eager_caches);

    // A new request continuing from those caches (a prompt-cache hit) answers as one continuing
    // from the eager caches: through the ragged path and through slots.
    std::vector<int64_t> longer = prompt;
    longer.insert(longer.end(), eager.tokens.begin(), eager.tokens.end());
    for (int64_t t : {7, 11, 13}) longer.push_back(t);
    const GenerateOptions o2 = g4slot_options(2 * W);
    Sequence reference(longer, o2, cache::clone(eager_caches), {}, {});
    while (!reference.done()) step(*model, {&reference}, 8, nullptr);
    cache::Caches got_copy = cache::clone(got);
    Sequence ragged(longer, o2, std::move(got), {}, {});
    while (!ragged.done()) step(*model, {&ragged}, 8, nullptr);
    Sequence slotted(longer, o2, std::move(got_copy), {}, {});
    while (!slotted.done()) step(*model, {&slotted}, 8, slots.get());
    const int64_t hit = static_cast<int64_t>(prompt.size() + eager.tokens.size()) - 1;
    EXPECT_EQ(ragged.result().stats.cached_tokens, hit);
    EXPECT_EQ(slotted.result().stats.cached_tokens, hit);
    ASSERT_EQ(reference.result().tokens.size(), static_cast<size_t>(2 * W));
    EXPECT_EQ(ragged.result().tokens, reference.result().tokens);
    EXPECT_EQ(slotted.result().tokens, reference.result().tokens);
    EXPECT_TRUE(slotted.result().stats.static_decode);
    EXPECT_FALSE(ragged.result().stats.static_decode);
  }
}

TEST(DecodeSlotsGemma4, APoolRowTakesARotatingCacheByPositionAndHandsItBack) {
  // A window of 4 with a step of 4: after 10 one-token updates the cache holds positions 6..9.
  const int64_t H = 2, D = 3;
  auto token = [&](int64_t p) { return at::full({1, H, 1, D}, double(p + 1)); };
  cache::RotatingKVCache rc(4, 4);
  for (int64_t p = 0; p < 10; ++p) rc.update(token(p), token(p) * -1);
  const int64_t start = rc.start();
  ASSERT_GT(start, 0);
  // A pool of 3 rows × 16 positions, row 1 already holding stale values (a former occupant).
  at::Tensor pk = at::full({3, H, 16, D}, 99.0), pv = at::full({3, H, 16, D}, 99.0);
  auto st = std::make_shared<cache::StaticState>();
  st->positions = at::zeros({3}, at::kLong);
  st->capacity = 16;
  cache::StaticKVCache pool(st, pk, pv);
  pool.write_row(1, rc);
  EXPECT_EQ(rc.offset(), 10);  // the source is unchanged
  for (int64_t p = 0; p < 16; ++p) {
    const double want = p >= start && p < 10 ? double(p + 1) : 99.0;  // by absolute position; the rest untouched
    EXPECT_EQ(pk[1].select(1, p).max().item<double>(), want) << "position " << p;
    EXPECT_EQ(pv[1].select(1, p).min().item<double>(), p >= start && p < 10 ? -want : 99.0) << "position " << p;
  }
  EXPECT_EQ(pk[0].max().item<double>(), 99.0);  // other rows untouched
  // Two decode steps in the pool (row 1 at positions 10 and 11), then back to the rotating cache.
  for (int64_t p = 10; p < 12; ++p) {
    st->positions.fill_(p);
    pool.update(at::full({3, H, 1, D}, double(p + 1)), at::full({3, H, 1, D}, -double(p + 1)));
  }
  pool.read_row(1, rc, 12);
  EXPECT_EQ(rc.offset(), 12);
  cache::KVView back = g4slot_held(rc, H, D);
  EXPECT_EQ(back.pos0 + back.keys.size(2), 12);
  ASSERT_GE(back.keys.size(2), 3);
  for (int64_t j = 0; j < back.keys.size(2); ++j) {
    EXPECT_EQ(back.keys.select(2, j).max().item<double>(), double(back.pos0 + j + 1)) << "held token " << j;
    EXPECT_EQ(back.values.select(2, j).min().item<double>(), -double(back.pos0 + j + 1)) << "held token " << j;
  }
  // What does not fit is refused with an error, not written.
  EXPECT_THROW(pool.write_row(3, rc), Error);  // no such row
  EXPECT_THROW(pool.read_row(1, rc, 11), Error);  // rc already holds 12
  EXPECT_THROW(pool.read_row(1, rc, 17), Error);  // past the positions
  cache::RotatingKVCache other_heads(4, 4);
  other_heads.update(at::zeros({1, H + 1, 1, D}), at::zeros({1, H + 1, 1, D}));
  EXPECT_THROW(pool.write_row(0, other_heads), Error);
  cache::RotatingKVCache too_long(4, 4);
  for (int64_t p = 0; p < 17; ++p) too_long.update(token(p), token(p));
  EXPECT_THROW(pool.write_row(0, too_long), Error);
}

TEST(DecodeSlotsGemma4, SlotBytesCountEveryLayerWithItsOwnKVPerToken) {
  auto model = g4slot_model("gemma4_e");
  const auto& cfg = dynamic_cast<models::gemma4::Gemma4Model&>(*model).config();
  int64_t per_token = 0, sharers = 0, sliding = 0;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    if (cfg.kv_shared(i)) {
      ++sharers;
      continue;
    }
    sliding += cfg.sliding[i];
    per_token += 2 * cfg.layer_kv_heads(i) * cfg.layer_head_dim(i) * 4;  // K and V, fp32
  }
  ASSERT_GT(sharers, 0);
  ASSERT_GT(sliding, 0);
  const DecodeSlots::SlotBytes cost = DecodeSlots::slot_bytes(*model);
  EXPECT_EQ(cost.per_token, per_token);
  EXPECT_EQ(cost.fixed, 0);
  auto slots = DecodeSlots::create(*model, 3, 192);
  ASSERT_TRUE(slots);
  EXPECT_EQ(slots->nbytes(), 3 * 192 * per_token);
}

}  // namespace
}  // namespace hearth::generate
