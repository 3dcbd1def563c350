// The static decode path (generate/graph_decode.cpp) for a hybrid family: Qwen3.5's linear-attention
// layers decode through cache::StaticRecurrentCache (states overwritten in place) beside static KV
// caches. On CPU the static step (run eagerly, HEARTH_STATIC_DECODE=1) gives the eager loop's greedy
// tokens and logprobs; the caches handed back afterwards carry on exactly (a second stretch).
// On a CUDA machine the captured graph equals the same static step run eagerly.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "cache/recurrent_cache.h"
#include "cache/static_recurrent_cache.h"
#include "core/torch_compat.h"
#include "generate/generate.h"
#include "models/registry.h"
#include "test_paths.h"

namespace hearth::generate {
namespace {

const std::filesystem::path kQwen = std::filesystem::path(HEARTH_SOURCE_DIR) / "tests/golden/models/qwen3_5";

struct HybridOut {
  std::vector<int64_t> tokens;
  std::vector<at::Tensor> logprobs;
  bool static_decode = false, cuda_graph = false;
};

HybridOut run_hybrid(models::Model& model, const std::vector<int64_t>& prompt, int64_t max_tokens, const char* graphs,
        const char* static_decode) {
  setenv("HEARTH_CUDA_GRAPHS", graphs, 1);
  setenv("HEARTH_STATIC_DECODE", static_decode, 1);
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.logprobs = true;
  HybridOut out;
  GenerationResult r = generate(model, prompt, o, [&](int64_t, const StepLogprobs* lp) {
    out.logprobs.push_back(lp ? lp->all.to(at::kCPU).clone() : at::Tensor());
    return true;
  });
  out.tokens = r.tokens;
  out.static_decode = r.stats.static_decode;
  out.cuda_graph = r.stats.cuda_graph;
  unsetenv("HEARTH_CUDA_GRAPHS");
  unsetenv("HEARTH_STATIC_DECODE");
  return out;
}

std::vector<int64_t> hybrid_prompt(int64_t n) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back((i * 13 + 7) % 97 + 2);
  return p;
}

TEST(StaticDecodeHybrid, Qwen3_5GreedyEqualsTheEagerLoop) {
  for (const char* variant : {"q35_tied_hv2", "q35_untied_hv1_mqa", "q3next_dense"}) {
    SCOPED_TRACE(variant);
    auto model = models::load_model(kQwen / variant, {at::kCPU, at::kFloat});
    // 40-token prompt, 300 new tokens: the KV layers' static buffers regrow mid-way, and the
    // recurrent states are handed back to growing caches and static again at each regrowth.
    HybridOut eager = run_hybrid(*model, hybrid_prompt(40), 300, "0", "0");
    HybridOut stat = run_hybrid(*model, hybrid_prompt(40), 300, "1", "1");
    EXPECT_FALSE(eager.static_decode);
    EXPECT_TRUE(stat.static_decode);
    ASSERT_EQ(eager.tokens.size(), 300u);
    EXPECT_EQ(stat.tokens, eager.tokens);
    ASSERT_EQ(stat.logprobs.size(), eager.logprobs.size());
    double worst = 0;
    for (size_t t = 0; t < stat.logprobs.size(); ++t)
      worst = std::max(worst, (stat.logprobs[t] - eager.logprobs[t]).abs().max().item<double>());
    // Same ops, but the static attention reads the whole capacity under a mask (another summation
    // order), amplified over 300 steps by these random models' large logits: measured 2.6e-5 at
    // worst (q35_untied_hv1_mqa) with libtorch 1.13 + OpenBLAS, 1.8e-4 with PyTorch 2.11's CPU
    // kernels — within the 5e-4 these models keep to transformers (qwen3_5_parity_test.cpp).
    EXPECT_LE(worst, 5e-4);
    std::set<int64_t> distinct(eager.tokens.begin(), eager.tokens.end());
    EXPECT_GE(distinct.size(), 5u) << "a continuation of one repeated token checks little";
  }
}

TEST(StaticRecurrentCache, WritesInPlaceAndHandsBackACopy) {
  cache::RecurrentCache grown;
  grown.update(at::randn({1, 6, 3}), at::randn({1, 2, 4, 4}), 5);
  auto st = std::make_shared<cache::StaticState>();
  st->host_offset = 5;
  cache::StaticRecurrentCache s(st, grown);
  const void* conv_ptr = s.conv_state().data_ptr();
  const void* rec_ptr = s.recurrent_state().data_ptr();
  at::Tensor c2 = at::randn({1, 6, 3}), r2 = at::randn({1, 2, 4, 4});
  s.write(c2, r2);
  EXPECT_EQ(s.conv_state().data_ptr(), conv_ptr);  // the same buffers: a replayed graph sees them
  EXPECT_EQ(s.recurrent_state().data_ptr(), rec_ptr);
  EXPECT_TRUE(s.conv_state().equal(c2));
  st->host_offset = 6;
  EXPECT_EQ(s.offset(), 6);
  auto back = s.to_recurrent_cache(6);
  EXPECT_EQ(back->offset(), 6);
  EXPECT_TRUE(back->recurrent_state().equal(r2));
  EXPECT_NE(back->recurrent_state().data_ptr(), rec_ptr);
  EXPECT_THROW(s.write(at::randn({1, 6, 2}), r2), Error);
  EXPECT_THROW(s.write(c2, r2.to(at::kDouble)), Error);
  st->host_offset = 9;
  EXPECT_THROW(cache::StaticRecurrentCache(st, grown), Error);  // 5 tokens seen, 9 expected
}

TEST(StaticDecodeHybrid, CudaGraphEqualsTheSameStepEager) {
  if (!compat::cuda_available()) GTEST_SKIP() << "needs a CUDA device";
  auto model = models::load_model(kQwen / "q35_tied_hv2", {at::kCUDA, at::kBFloat16});
  HybridOut graph = run_hybrid(*model, hybrid_prompt(40), 200, "1", "0");
  HybridOut eager_static = run_hybrid(*model, hybrid_prompt(40), 200, "nocapture", "0");
  EXPECT_TRUE(graph.cuda_graph);
  EXPECT_EQ(graph.tokens, eager_static.tokens);
  size_t identical = 0;
  for (size_t t = 0; t < graph.logprobs.size(); ++t)
    identical += (graph.logprobs[t] - eager_static.logprobs[t]).abs().max().item<double>() == 0.0;
  std::cout << "[static-decode-hybrid] graph vs the same step eager: " << identical << "/" << graph.logprobs.size()
            << " steps bit-identical\n";
  EXPECT_GE(identical * 100, graph.logprobs.size() * 95);
  HybridOut eager = run_hybrid(*model, hybrid_prompt(40), 200, "0", "0");
  size_t agree = 0;
  while (agree < eager.tokens.size() && agree < graph.tokens.size() && eager.tokens[agree] == graph.tokens[agree]) ++agree;
  std::cout << "[static-decode-hybrid] bf16 graph vs eager loop: " << agree << "/" << eager.tokens.size()
            << " greedy tokens agree\n";
}

}  // namespace
}  // namespace hearth::generate
