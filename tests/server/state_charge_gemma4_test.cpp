// The memory-budget charge of a request (Engine::state_bytes) against what its caches really hold,
// on the tiny golden Gemma 4 (sliding-window layers of width 8, a full-attention layer, KV-sharing
// layers; CPU fp32): at every step of a long prefill and the decode after it, for chunks longer and
// shorter than the caches' growth step, the charge is never below the held bytes — a sliding layer's
// buffer grows to its window plus one prefill chunk — and it is reached, so it is not loose either.
// Then on the tiny golden llama, two requests prefilled together in one padded forward (batched
// prefill forced on): the short one's buffers stay within its own charge.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>

#include "../adapters/lora_test_util.h"
#include "server/model_engine.h"

namespace hearth::server {
namespace {

TEST(StateChargeGemma4, TheChargeBoundsWhatTheCachesHoldAtEveryStep) {
  for (int64_t chunk : {2048, 300, 64, 5}) {
    SCOPED_TRACE(chunk);
    ModelEngineOptions o;
    o.model_dir = hearth::testing::golden_model("gemma4_e");
    o.device = "cpu";
    o.dtype = "float32";
    o.context_length = 1024;  // above the tiny model's 256: a prompt longer than the growth step
    o.allow_long_context = true;
    o.prompt_cache_bytes = 0;
    o.decode_slots = false;
    o.prefill_step_size = chunk;
    ModelEngine e(o);
    const Engine::StateCharge c = e.state_charge();
    ASSERT_GT(c.per_token, 0);
    ASSERT_GT(c.window_per_token, 0);
    EXPECT_EQ(c.window_tokens, 8 - 1 + chunk);
    EXPECT_EQ(c.fixed, 0);  // no recurrent layer

    CompletionRequest req;
    req.chat = false;
    for (int64_t i = 0; i < 700; ++i) req.prompt_ids.push_back((i * 29 + 7) % 500);
    req.max_tokens = 20;
    req.sampling.temperature = 0.0;
    const Prompt prompt = e.prepare(req);
    const int64_t charged = e.state_bytes(700 + 20);
    auto seq = e.start_sequence(prompt, req, [](const TokenEvent&) { return true; });
    int64_t most = 0;
    for (int steps = 0; !seq->done(); ++steps) {
      ASSERT_LT(steps, 1000);
      e.step({seq.get()});
      const int64_t held = e.held_bytes(*seq);
      EXPECT_LE(held, charged) << "step " << steps;
      most = std::max(most, held);
    }
    EXPECT_EQ(most, charged);
    e.finish_sequence(*seq);
    // A context of 2^62 tokens (a config's max_position_embeddings) saturates instead of wrapping
    // to a small charge that a budget would admit.
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    EXPECT_EQ(e.state_bytes(int64_t{1} << 62), kMax);
    EXPECT_EQ(e.state_bytes(kMax), kMax);
    EXPECT_GT(e.state_bytes(int64_t{1} << 40), e.state_bytes(1 << 20));
  }
}

// Sets HEARTH_BATCH_PREFILL=1 for one scope, then restores it.
class StateChargeBatchPrefillOn {
 public:
  StateChargeBatchPrefillOn() {
    if (const char* v = std::getenv("HEARTH_BATCH_PREFILL")) saved_ = v;
    setenv("HEARTH_BATCH_PREFILL", "1", 1);
  }
  ~StateChargeBatchPrefillOn() {
    if (saved_) setenv("HEARTH_BATCH_PREFILL", saved_->c_str(), 1);
    else unsetenv("HEARTH_BATCH_PREFILL");
  }

 private:
  std::optional<std::string> saved_;
};

TEST(StateChargeBatchedPrefill, APaddedRowHoldsNoMoreThanItsOwnCharge) {
  // A 300-token prompt and a 5-token one (3 tokens to generate: charged 8 tokens rounded up to the
  // 256-token growth step) in one step. Padding the short row to 300 positions would grow its
  // buffers to 512 tokens, twice its charge, and the trim after the forward keeps them.
  StateChargeBatchPrefillOn on;  // the CPU's default is one forward per sequence
  ModelEngineOptions o;
  o.model_dir = hearth::testing::golden_model("llama_gqa_tied");
  o.device = "cpu";
  o.dtype = "float32";
  o.context_length = 1024;
  o.allow_long_context = true;
  o.prompt_cache_bytes = 0;
  o.decode_slots = false;
  o.prefill_step_size = 1024;  // also the step's prefill budget: all three rows' chunks fit one forward
  ModelEngine e(o);
  ASSERT_TRUE(e.supports_batching());
  const std::vector<std::pair<int64_t, int64_t>> shapes{{300, 4}, {5, 3}, {20, 300}};  // prompt, max_tokens
  std::vector<std::unique_ptr<ActiveSequence>> seqs;
  std::vector<int64_t> charged;
  for (const auto& [n, max_tokens] : shapes) {
    CompletionRequest req;
    req.chat = false;
    for (int64_t i = 0; i < n; ++i) req.prompt_ids.push_back((i * 31 + n) % 500);
    req.max_tokens = max_tokens;
    req.sampling.temperature = 0.0;
    seqs.push_back(e.start_sequence(e.prepare(req), req, [](const TokenEvent&) { return true; }));
    charged.push_back(e.state_bytes(n + max_tokens));
  }
  EXPECT_EQ(charged[1], e.state_bytes(256));
  EXPECT_EQ(charged[0], e.state_bytes(512));
  for (int steps = 0;; ++steps) {
    ASSERT_LT(steps, 1000);
    std::vector<ActiveSequence*> live;
    for (auto& s : seqs)
      if (!s->done()) live.push_back(s.get());
    if (live.empty()) break;
    e.step(live);
    for (size_t i = 0; i < seqs.size(); ++i)
      EXPECT_LE(e.held_bytes(*seqs[i]), charged[i]) << "sequence " << i << ", step " << steps;
  }
  // The 20-token row, charged 320 tokens (512 with the growth step), may still share the forward.
  EXPECT_EQ(e.held_bytes(*seqs[2]), charged[2]);
  for (auto& s : seqs) e.finish_sequence(*s);
}

}  // namespace
}  // namespace hearth::server
