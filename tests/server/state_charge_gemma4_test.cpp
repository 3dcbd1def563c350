// The memory-budget charge of a request (Engine::state_bytes) against what its caches really hold,
// on the tiny golden Gemma 4 (sliding-window layers of width 8, a full-attention layer, KV-sharing
// layers; CPU fp32): at every step of a long prefill and the decode after it, for chunks longer and
// shorter than the caches' growth step, the charge is never below the held bytes — a sliding layer's
// buffer grows to its window plus one prefill chunk — and it is reached, so it is not loose either.
#include <gtest/gtest.h>

#include <algorithm>

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
  }
}

}  // namespace
}  // namespace hearth::server
