// Decode slots' start-up warm-up (DecodeSlots::warm_up) on CPU fp32: the buckets it records are
// exactly the ones the scheduler can pick, running each bucket's step eagerly once (the CPU
// stand-in for a capture) leaves later generations exact, on CPU without run_eager it does nothing,
// and it refuses a pool in use. The capture itself needs a GPU (the lead's H200 run).
#include <gtest/gtest.h>

#include <set>

#include "../models/random_llama.h"
#include "core/error.h"
#include "generate/batch.h"
#include "generate/decode_slots.h"

namespace hearth::generate {
namespace {

using hearth::testing::random_llama;
using hearth::testing::tiny_llama_config;

std::vector<int64_t> warmup_prompt(int64_t len, int64_t seed, int64_t vocab) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back((seed * 29 + i * 13 + 3) % vocab);
  return p;
}

GenerateOptions warmup_greedy(int64_t max_tokens) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = 0.0;
  o.prefill_step_size = 8;
  return o;
}

// Greedy tokens of each prompt, decoded together through `slots` (nullptr: the eager loop alone).
std::vector<std::vector<int64_t>> warmup_decode(models::Model& model, DecodeSlots* slots,
                                                const std::vector<std::vector<int64_t>>& prompts, int64_t max_tokens) {
  if (!slots) {
    std::vector<std::vector<int64_t>> out;
    for (const auto& p : prompts) out.push_back(generate(model, p, warmup_greedy(max_tokens)).tokens);
    return out;
  }
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (const auto& p : prompts)
    seqs.push_back(std::make_unique<Sequence>(p, warmup_greedy(max_tokens), cache::Caches{}, std::vector<std::string>{},
                                              StepCallback{}));
  for (;;) {
    std::vector<Sequence*> live;
    for (auto& s : seqs)
      if (!s->done()) live.push_back(s.get());
    if (live.empty()) break;
    step(model, live, 64, slots);
  }
  std::vector<std::vector<int64_t>> out;
  for (auto& s : seqs) out.push_back(s->result().tokens);
  return out;
}

TEST(DecodeSlotsWarmup, TheBucketsItRecordsAreExactlyTheOnesTheSchedulerCanPick) {
  for (auto [slots, capacity] : {std::pair<int64_t, int64_t>{1, 100}, {5, 300}, {8, 1024}, {32, 4096}}) {
    const auto all = DecodeSlots::all_buckets(slots, capacity);
    const std::set<std::pair<int64_t, int64_t>> listed(all.begin(), all.end());
    EXPECT_EQ(listed.size(), all.size()) << "duplicates for " << slots << " x " << capacity;
    std::set<std::pair<int64_t, int64_t>> reachable;
    // Every highest occupied slot with every longest row position a slotted sequence can have.
    for (int64_t top = 0; top < slots; ++top)
      for (int64_t longest = 0; longest < capacity; ++longest)
        reachable.insert(DecodeSlots::bucket_for(slots, capacity, top, longest));
    EXPECT_EQ(reachable, listed) << slots << " x " << capacity;
    EXPECT_EQ(all.size(), DecodeSlots::batch_buckets(slots).size() * DecodeSlots::length_buckets(capacity).size());
  }
  EXPECT_EQ(DecodeSlots::all_buckets(32, 4096).size(), 36u);  // 6 batch x 6 length buckets
  EXPECT_EQ(DecodeSlots::bucket_for(32, 4096, 2, 127), (std::pair<int64_t, int64_t>{4, 128}));
  EXPECT_EQ(DecodeSlots::bucket_for(32, 4096, 3, 128), (std::pair<int64_t, int64_t>{4, 256}));
}

TEST(DecodeSlotsWarmup, RunningEveryBucketOnceLeavesGenerationsExact) {
  auto model = random_llama(tiny_llama_config({{"max_position_embeddings", 512}}), at::kFloat, 5);
  const int64_t V = model->vocab_size();
  const std::vector<std::vector<int64_t>> prompts{warmup_prompt(4, 1, V), warmup_prompt(130, 2, V), warmup_prompt(20, 3, V)};
  const auto want = warmup_decode(*model, nullptr, prompts, 24);

  auto slots = DecodeSlots::create(*model, 3, 300);
  ASSERT_TRUE(slots);
  // CPU: nothing to capture, so by default nothing happens.
  DecodeSlots::Warmup none = slots->warm_up();
  EXPECT_EQ(none.buckets, 0);
  EXPECT_EQ(slots->recorded_buckets(), 0);
  // The CPU stand-in: every (b, L) of {1, 2, 3} x {128, 256, 300} recorded and run once.
  DecodeSlots::Warmup w = slots->warm_up(/*run_eager=*/true);
  EXPECT_EQ(w.buckets, 9);
  EXPECT_EQ(w.captured, 0);
  EXPECT_GE(w.seconds, 0.0);
  EXPECT_EQ(slots->recorded_buckets(), 9);
  EXPECT_EQ(slots->eager_steps(), 0);  // warm-up steps are not counted as decode steps
  EXPECT_EQ(slots->warm_up(true).buckets, 0);  // all recorded already

  EXPECT_EQ(warmup_decode(*model, slots.get(), prompts, 24), want);
  EXPECT_GT(slots->eager_steps(), 0);
  EXPECT_EQ(slots->recorded_buckets(), 9);  // the requests found every bucket ready

  // A pool in use is refused.
  Sequence busy(warmup_prompt(6, 4, V), warmup_greedy(10), {}, {}, {});
  step(*model, {&busy}, 64, slots.get());
  ASSERT_EQ(slots->occupied(), 1);
  EXPECT_THROW(slots->warm_up(true), Error);
}

}  // namespace
}  // namespace hearth::generate
