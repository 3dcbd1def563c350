// Sampler: greedy, top-k=1, seeds, the exact kept sets of top-p/min-p/top-k on hand-made
// distributions (expected sets worked out from mlx-lm's rules in the comments), penalty math.
#include "generate/sampler.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

using namespace hearth::generate;

namespace {
at::Tensor logprobs_of(std::vector<double> probs) { return at::tensor(probs, at::kDouble).log().to(at::kFloat); }
std::set<int64_t> kept(const at::Tensor& lp) {
  std::set<int64_t> s;
  for (int64_t i = 0; i < lp.size(0); ++i)
    if (std::isfinite(lp[i].item<float>())) s.insert(i);
  return s;
}
}  // namespace

TEST(Sampler, GreedyIsArgmax) {
  Sampler s({});
  EXPECT_EQ(s.sample(at::tensor({0.1f, 2.5f, -1.f, 2.4f}), {}), 1);
  EXPECT_EQ(s.sample(at::tensor({-3.f, -2.f, -2.5f}), {}), 1);
}

TEST(Sampler, LogitBiasIsAddedFirstEveryStep) {
  SamplingParams p;
  p.logit_bias = {{2, 5.0}, {0, -1.0}};
  Sampler s(p);
  const at::Tensor logits = at::zeros({4});
  // Applied even before any token exists (the penalties need a history; the bias does not).
  const at::Tensor out = s.process(logits, {});
  EXPECT_TRUE(at::equal(out, at::tensor({-1.0f, 0.0f, 5.0f, 0.0f})));
  EXPECT_TRUE(at::equal(logits, at::zeros({4})));  // the caller's tensor is untouched
  EXPECT_EQ(s.sample(logits, {1, 1}), 2);
  // Then the penalties, on the biased logits (mlx-lm's order): presence 1 at id 2 → 4.
  p.presence_penalty = 1.0;
  Sampler t(p);
  EXPECT_TRUE(at::equal(t.process(logits, {2}), at::tensor({-1.0f, 0.0f, 4.0f, 0.0f})));
  p.logit_bias = {{4, 1.0}};
  EXPECT_THROW(Sampler(p).process(logits, {}), hearth::Error);
}

TEST(Sampler, TopK1IsGreedy) {
  at::manual_seed(0);
  SamplingParams p;
  p.temperature = 1.5;
  p.top_k = 1;
  p.seed = 7;
  Sampler s(p);
  for (int i = 0; i < 20; ++i) {
    at::Tensor l = at::randn({50});
    EXPECT_EQ(s.sample(l, {}), l.argmax().item<int64_t>());
  }
}

TEST(Sampler, SameSeedSameSequence) {
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 1234;
  at::manual_seed(0);
  at::Tensor l = at::randn({100});
  Sampler a(p), b(p);
  std::vector<int64_t> sa, sb;
  for (int i = 0; i < 50; ++i) {
    sa.push_back(a.sample(l, {}));
    sb.push_back(b.sample(l, {}));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_GT(std::set<int64_t>(sa.begin(), sa.end()).size(), 5u);  // really sampling
  p.seed = 99;
  Sampler c(p);
  std::vector<int64_t> sc;
  for (int i = 0; i < 50; ++i) sc.push_back(c.sample(l, {}));
  EXPECT_NE(sa, sc);
}

TEST(Sampler, TopPKeepsTheNucleus) {
  // probs 0.05, 0.5, 0.15, 0.3. Ascending cumulative: 0.05, 0.2, 0.5, 1.0 (for ids 0, 2, 3, 1).
  // top_p 0.7 keeps cum > 0.3: ids 3 (0.5) and 1 (1.0).
  auto lp = logprobs_of({0.05, 0.5, 0.15, 0.3});
  EXPECT_EQ(kept(apply_top_p(lp, 0.7)), (std::set<int64_t>{1, 3}));
  // top_p 0.9 keeps cum > 0.1: ids 2, 3, 1.
  EXPECT_EQ(kept(apply_top_p(lp, 0.9)), (std::set<int64_t>{1, 2, 3}));
  // Kept entries keep their value.
  EXPECT_EQ(apply_top_p(lp, 0.7)[1].item<float>(), lp[1].item<float>());
}

TEST(Sampler, MinPKeepsAboveFractionOfMax) {
  // max p 0.5; min_p 0.35 → threshold 0.175: keeps 0.5, 0.3 (not 0.15, 0.05).
  auto lp = logprobs_of({0.05, 0.5, 0.15, 0.3});
  EXPECT_EQ(kept(apply_min_p(lp, 0.35, 1)), (std::set<int64_t>{1, 3}));
  // min_p 0.25 → threshold 0.125: also 0.15.
  EXPECT_EQ(kept(apply_min_p(lp, 0.25, 1)), (std::set<int64_t>{1, 2, 3}));
  // min_tokens_to_keep 3 overrides.
  EXPECT_EQ(kept(apply_min_p(lp, 0.9, 3)), (std::set<int64_t>{1, 2, 3}));
}

TEST(Sampler, TopKKeepsK) {
  auto lp = logprobs_of({0.05, 0.5, 0.15, 0.3});
  EXPECT_EQ(kept(apply_top_k(lp, 2)), (std::set<int64_t>{1, 3}));
  EXPECT_EQ(kept(apply_top_k(lp, 4)), (std::set<int64_t>{0, 1, 2, 3}));
}

TEST(Sampler, RepetitionPenaltyMath) {
  at::Tensor l = at::tensor({2.0f, -1.0f, 3.0f, -4.0f});
  auto out = apply_repetition_penalty(l, {0, 1, 1}, 2.0);
  EXPECT_FLOAT_EQ(out[0].item<float>(), 1.0f);   // positive: divided
  EXPECT_FLOAT_EQ(out[1].item<float>(), -2.0f);  // negative: multiplied (once, despite repeats)
  EXPECT_FLOAT_EQ(out[2].item<float>(), 3.0f);   // not in context
  EXPECT_FLOAT_EQ(out[3].item<float>(), -4.0f);
  // The context is the last repetition_context_size tokens: penalizing 2 flips the argmax.
  SamplingParams p;
  p.repetition_penalty = 2.0;
  p.repetition_context_size = 1;
  Sampler s(p);
  EXPECT_EQ(s.sample(l, {2, 0}), 2);  // only token 0 penalized: 3 stays max
  EXPECT_EQ(s.sample(l, {0, 2}), 0);  // token 2 penalized to 1.5 < 2
}

TEST(Sampler, FiltersRestrictSamples) {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.7;  // keeps ids 1 and 3 (see TopPKeepsTheNucleus)
  p.seed = 3;
  Sampler s(p);
  auto logits = logprobs_of({0.05, 0.5, 0.15, 0.3}) + 1.0;
  std::set<int64_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(s.sample(logits, {}));
  EXPECT_EQ(seen, (std::set<int64_t>{1, 3}));
}

// Presence/frequency penalties (mlx-lm make_presence_penalty / make_frequency_penalty), by hand:
// logits [1, 2, 3, 4, 5], context [1, 3, 3, 3] (id 1 once, id 3 three times).
TEST(Sampler, PresencePenaltySubtractsOncePerDistinctToken) {
  at::Tensor l = at::tensor({1.f, 2.f, 3.f, 4.f, 5.f});
  at::Tensor out = apply_presence_penalty(l, {1, 3, 3, 3}, 0.5);
  std::vector<float> want = {1.f, 1.5f, 3.f, 3.5f, 5.f};
  for (int i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(out[i].item<float>(), want[i]) << i;
  EXPECT_FLOAT_EQ(l[1].item<float>(), 2.f);  // input untouched
}

TEST(Sampler, FrequencyPenaltySubtractsPerOccurrence) {
  at::Tensor l = at::tensor({1.f, 2.f, 3.f, 4.f, 5.f});
  at::Tensor out = apply_frequency_penalty(l, {1, 3, 3, 3}, 0.5);
  std::vector<float> want = {1.f, 1.5f, 3.f, 2.5f, 5.f};
  for (int i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(out[i].item<float>(), want[i]) << i;
  // Negative penalties encourage repetition (OpenAI allows [-2, 2]).
  EXPECT_FLOAT_EQ(apply_frequency_penalty(l, {4, 4}, -1.0)[4].item<float>(), 7.f);
}

TEST(Sampler, ProcessChainsPenaltiesOverTheirWindows) {
  // repetition 2 over the last 2 tokens [3, 4]: 4/2 = 2, 5/2 = 2.5; presence 1 over the last 3
  // [2, 3, 4]: ids 2, 3, 4 minus 1; frequency 0.25 over all [0, 4, 2, 3, 4]: id 4 twice.
  SamplingParams p;
  p.repetition_penalty = 2.0;
  p.repetition_context_size = 2;
  p.presence_penalty = 1.0;
  p.presence_context_size = 3;
  p.frequency_penalty = 0.25;
  p.frequency_context_size = 0;  // 0 = the whole history (mlx-lm's tokens[-0:])
  Sampler s(p);
  at::Tensor out = s.process(at::tensor({1.f, 2.f, 3.f, 4.f, 5.f}), {0, 4, 2, 3, 4});
  std::vector<float> want = {1.f - 0.25f, 2.f, 3.f - 1.f - 0.25f, 2.f - 1.f - 0.25f, 2.5f - 1.f - 0.5f};
  for (int i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(out[i].item<float>(), want[i]) << i;
  // The penalties steer greedy decoding: 4 would win, the frequency penalty flips it to 3.
  SamplingParams g;
  g.frequency_penalty = 1.5;
  Sampler greedy(g);
  EXPECT_EQ(greedy.sample(at::tensor({0.f, 0.f, 0.f, 2.f, 3.f}), {}), 4);
  EXPECT_EQ(greedy.sample(at::tensor({0.f, 0.f, 0.f, 2.f, 3.f}), {4}), 3);
}

// Issue 16 item 13: at the legal extremes of every parameter the most likely token still comes out.
TEST(Sampler, TinyTopPKeepsTheTopToken) {
  // 1 - 1e-30 rounds to 1, and the float cumulative sum of many distributions ends just below 1:
  // without the guard, top-p kept nothing for those (about half of these).
  at::manual_seed(3);
  for (int i = 0; i < 64; ++i) {
    at::Tensor lp = at::log_softmax(at::randn({37}) * 3, -1);
    const int64_t top = lp.argmax().item<int64_t>();
    for (double top_p : {1e-30, 1e-12, std::numeric_limits<double>::denorm_min()}) {
      at::Tensor out = apply_top_p(lp, top_p);
      EXPECT_TRUE(std::isfinite(out[top].item<float>())) << "case " << i << " top_p " << top_p;
    }
  }
  // min_p 1.0 with min_tokens_to_keep 0 still keeps the maximum; top_k 0 is off, not "keep none"
  at::Tensor lp = logprobs_of({0.1, 0.6, 0.3});
  EXPECT_EQ(kept(apply_min_p(lp, 1.0, 0)), (std::set<int64_t>{1}));
  EXPECT_EQ(kept(apply_top_k(lp, 0)), (std::set<int64_t>{0, 1, 2}));
}

TEST(Sampler, ExtremeFilterCombinationsAndTinyTemperaturesAreGreedy) {
  at::manual_seed(5);
  const double denorm = std::numeric_limits<double>::denorm_min();
  for (int i = 0; i < 8; ++i) {
    const at::Tensor l = at::randn({41}) * 4;
    const int64_t top = l.argmax().item<int64_t>();
    for (double temp : {1e-30, 1e-45, 1e-310, denorm, 1e-5})
      for (double top_p : {0.0, 1e-30, denorm})
        for (double min_p : {0.0, 1.0})
          for (int64_t top_k : {0, 1}) {
            SamplingParams p;
            p.temperature = temp;
            p.top_p = top_p;
            p.min_p = min_p;
            p.min_tokens_to_keep = 0;
            p.top_k = top_k;
            p.seed = static_cast<uint64_t>(i);
            Sampler s(p);
            for (int draw = 0; draw < 3; ++draw)
              ASSERT_EQ(s.sample(l, {}), top) << "temp " << temp << " top_p " << top_p << " min_p " << min_p
                                              << " top_k " << top_k;
          }
  }
  // a non-finite temperature is refused, not sampled with
  SamplingParams bad;
  bad.temperature = std::numeric_limits<double>::infinity();
  EXPECT_THROW(Sampler{bad}, hearth::Error);
}

TEST(Sampler, RepetitionPenaltyExtremesStayFiniteAndKeepTheTopToken) {
  const at::Tensor l = at::tensor({2.0f, 0.0f, -1.0f, 1.5f});
  // 1e-300 is 0 in float32: 2/0 was +inf and 0/0 NaN (which argmax picks)
  at::Tensor tiny = apply_repetition_penalty(l, {0, 1, 2}, 1e-300);
  EXPECT_TRUE(at::isfinite(tiny).all().item<bool>()) << tiny;
  EXPECT_EQ(tiny[0].item<float>(), std::numeric_limits<float>::max());  // 2 / 1e-300, clamped
  EXPECT_EQ(tiny[1].item<float>(), 0.0f);
  EXPECT_EQ(tiny[3].item<float>(), 1.5f);
  at::Tensor denorm = apply_repetition_penalty(l, {0, 1, 2}, std::numeric_limits<double>::denorm_min());
  EXPECT_TRUE(at::isfinite(denorm).all().item<bool>()) << denorm;
  EXPECT_EQ(apply_repetition_penalty(l, {0, 1, 2}, 1e300)[2].item<float>(), -std::numeric_limits<float>::max());
  for (double penalty : {1e-300, std::numeric_limits<double>::denorm_min(), 1e-30, 100.0, 1e300})
    for (double temp : {0.0, 1e-310, 1.0}) {
      SamplingParams p;
      p.repetition_penalty = penalty;
      p.temperature = temp;
      p.top_p = 1e-30;
      Sampler s(p);
      // the top token of the penalized logits: 0 when penalties < 1 boost it, 3 when > 1 sink 0
      const int64_t want = penalty < 1 ? 0 : 3;
      EXPECT_EQ(s.sample(l, {0, 1, 2}), want) << "penalty " << penalty << " temp " << temp;
    }
}

TEST(Sampler, ArgmaxBlockedIsArgmaxWithTiesAndNaN) {
  at::manual_seed(41);
  // Coarse values (many ties across and inside blocks): the first maximum wins, as in argmax.
  for (int trial = 0; trial < 20; ++trial) {
    const at::Tensor lg = at::randint(0, 6, {3, 1024}).to(at::kFloat);
    for (int64_t c : {1, 2, 64, 256, 1024}) {
      EXPECT_TRUE(at::equal(argmax_blocked(lg, c), lg.argmax(-1))) << "c " << c;
      EXPECT_TRUE(at::equal(argmax_blocked(lg[1], c), lg[1].argmax(-1))) << "1-D, c " << c;
    }
  }
  // Ties placed across two blocks: the earlier block's index.
  at::Tensor t = at::zeros({512});
  t[300] = 5;
  t[100] = 5;
  EXPECT_EQ(argmax_blocked(t, 128).item<int64_t>(), 100);
  EXPECT_EQ(argmax_last(t).item<int64_t>(), 100);
  // A NaN counts as the maximum in argmax; so it does here.
  t[400] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(argmax_blocked(t, 128).item<int64_t>(), t.argmax(-1).item<int64_t>());
  EXPECT_THROW(argmax_blocked(t, 300), hearth::Error);
  EXPECT_THROW(argmax_blocked(t, 0), hearth::Error);
}
