// Cancellation in continuous batching (generate/batch.h, GenerateOptions::cancelled) on a tiny random
// llama, CPU fp32: a sequence whose flag is raised during a long prefill ends at the next prompt
// chunk — between steps, and between the chunks of one step — having run only the chunks before it
// and never calling its callback; a decoding one ends without another forward; a cancelled
// share_prefill parent hands its prefill to its child, which answers as it would alone. Chunks are
// counted (GenerationStats::prefill_chunks, the caches' offset), not timed.
#include <gtest/gtest.h>

#include <atomic>

#include "../models/random_llama.h"
#include "generate/batch.h"

namespace hearth::generate {
namespace {

using hearth::testing::random_llama;
using hearth::testing::tiny_llama_config;

std::vector<int64_t> cancel_prompt(int64_t len) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back((i * 11 + 5) % 64);
  return p;
}

GenerateOptions cancel_options(int64_t chunk, std::atomic<bool>* flag, int64_t max_tokens = 4) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = 0.0;
  o.prefill_step_size = chunk;
  if (flag) o.cancelled = [flag] { return flag->load(); };
  return o;
}

std::unique_ptr<models::llama::LlamaModel> cancel_model() {
  return random_llama(tiny_llama_config({{"max_position_embeddings", 1024}}), at::kFloat, 7);
}

TEST(BatchCancel, APrefillStopsAtTheNextStepOnceCancelled) {
  auto model = cancel_model();
  std::atomic<bool> flag{false};
  int calls = 0;
  Sequence s(cancel_prompt(200), cancel_options(4, &flag), {}, {}, [&](int64_t, const StepLogprobs*) {
    ++calls;
    return true;
  });
  step(*model, {&s}, 4);  // a budget of one chunk per step, as the server's
  step(*model, {&s}, 4);
  ASSERT_TRUE(s.prefilling());
  EXPECT_EQ(s.result().stats.prefill_chunks, 2);
  flag = true;
  step(*model, {&s}, 4);
  EXPECT_TRUE(s.done());
  EXPECT_TRUE(s.result().stats.cancelled);
  EXPECT_EQ(s.result().stats.prefill_chunks, 2);  // of the prompt's 50
  EXPECT_EQ(cache::offset_of(s.caches()), 8);
  EXPECT_TRUE(s.result().tokens.empty());
  EXPECT_EQ(calls, 0);
}

TEST(BatchCancel, APrefillStopsBetweenTheChunksOfOneStep) {
  auto model = cancel_model();
  std::atomic<bool> flag{false};
  Sequence s(cancel_prompt(200), cancel_options(4, &flag), {}, {}, {});
  // Snapshots come after each chunk: the third raises the flag, as a client leaving mid-step would.
  s.on_snapshot(4, [&](int64_t tokens, cache::Caches) {
    if (tokens == 12) flag = true;
  });
  step(*model, {&s}, 200);  // the whole prompt planned in one step: 50 chunk-rounds
  EXPECT_TRUE(s.done());
  EXPECT_TRUE(s.result().stats.cancelled);
  EXPECT_EQ(s.result().stats.prefill_chunks, 3);
  EXPECT_EQ(cache::offset_of(s.caches()), 12);
}

TEST(BatchCancel, ADecodingSequenceEndsWithoutAnotherForward) {
  auto model = cancel_model();
  std::atomic<bool> flag{false};
  std::vector<int64_t> seen;
  Sequence s(cancel_prompt(10), cancel_options(4, &flag, 50), {}, {}, [&](int64_t t, const StepLogprobs*) {
    seen.push_back(t);
    return true;
  });
  while (s.prefilling()) step(*model, {&s}, 4);
  ASSERT_EQ(seen.size(), 2u);  // the first token, then the same step's decode
  flag = true;
  step(*model, {&s}, 4);
  EXPECT_TRUE(s.done());
  EXPECT_TRUE(s.result().stats.cancelled);
  EXPECT_EQ(s.result().tokens, seen);
  EXPECT_EQ(cache::offset_of(s.caches()), 11);  // the prompt and the first token; the last was never fed
}

TEST(BatchCancel, ACancelledParentHandsItsPrefillToItsChild) {
  auto model = cancel_model();
  const std::vector<int64_t> prompt = cancel_prompt(40);
  const std::vector<int64_t> want = generate(*model, prompt, cancel_options(4, nullptr, 6)).tokens;
  std::atomic<bool> parent_flag{false};
  Sequence parent(prompt, cancel_options(4, &parent_flag, 6), {}, {}, {});
  Sequence child(prompt, cancel_options(4, nullptr, 6), {}, {}, {});
  parent.share_prefill(child);
  std::vector<Sequence*> both{&parent, &child};
  step(*model, both, 4);
  step(*model, both, 4);
  parent_flag = true;
  for (int i = 0; i < 100 && !child.done(); ++i) step(*model, {&parent, &child}, 4);
  EXPECT_TRUE(parent.result().stats.cancelled);
  EXPECT_EQ(parent.result().stats.prefill_chunks, 2);
  ASSERT_TRUE(child.done());
  EXPECT_FALSE(child.result().stats.cancelled);
  EXPECT_EQ(child.result().stats.prefill_chunks, 8);  // it went on from the parent's 8 tokens
  EXPECT_EQ(child.result().tokens, want);

  // A child cancelled while it waits leaves; its parent goes on alone.
  std::atomic<bool> child_flag{true};
  Sequence p2(prompt, cancel_options(4, nullptr, 6), {}, {}, {});
  Sequence c2(prompt, cancel_options(4, &child_flag, 6), {}, {}, {});
  p2.share_prefill(c2);
  for (int i = 0; i < 100 && !p2.done(); ++i) step(*model, {&p2, &c2}, 4);
  EXPECT_TRUE(c2.done());
  EXPECT_TRUE(c2.result().stats.cancelled);
  EXPECT_TRUE(c2.result().tokens.empty());
  EXPECT_EQ(p2.result().tokens, want);
}

}  // namespace
}  // namespace hearth::generate
