// Continuous batching (generate/batch.h) on tiny random llama models, CPU fp32: sequences decoded
// together — ragged positions, joining mid-way, different adapters and seeds per row, sliding
// windows, a family without ragged batches — give the tokens each gives alone, and logprobs within
// float rounding of the batched matmuls.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "../models/random_llama.h"
#include "models/registry.h"
#include "test_paths.h"
#include "generate/batch.h"
#include "generate/constraint.h"
#include "nn/linear.h"

namespace hearth::generate {
namespace {

using hearth::testing::random_llama;
using hearth::testing::tiny_llama_config;

struct Trace {
  std::vector<int64_t> tokens;
  std::vector<at::Tensor> logprobs;
};

std::vector<int64_t> prompt_of(int64_t len, int64_t seed) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back((seed * 7 + i * 13 + 3) % 64);
  return p;
}

GenerateOptions options(int64_t max_tokens, double temperature = 0.0, uint64_t seed = 0) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = temperature;
  o.sampling.seed = seed;
  o.logprobs = true;
  o.prefill_step_size = 8;  // several chunks for the longer prompts
  return o;
}

Trace alone(models::Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& o,
          const std::vector<std::string>& adapters = {}) {
  Trace r;
  nn::ActiveAdapters scope(adapters);
  r.tokens = generate(model, prompt, o, [&](int64_t, const StepLogprobs* lp) {
               r.logprobs.push_back(lp ? lp->all.clone() : at::Tensor());
               return true;
             }).tokens;
  return r;
}

// Runs the sequences together; sequence i joins at step joins[i].
std::vector<Trace> batched(models::Model& model, const std::vector<std::vector<int64_t>>& prompts,
                         const std::vector<GenerateOptions>& opts, const std::vector<int>& joins,
                         const std::vector<std::vector<std::string>>& adapters, int* max_together = nullptr) {
  std::vector<Trace> runs(prompts.size());
  std::vector<std::unique_ptr<Sequence>> seqs(prompts.size());
  int together = 0;
  for (int step_no = 0;; ++step_no) {
    for (size_t i = 0; i < prompts.size(); ++i)
      if (!seqs[i] && joins[i] <= step_no)
        seqs[i] = std::make_unique<Sequence>(prompts[i], opts[i], cache::Caches{}, adapters[i],
                                             [&runs, i](int64_t, const StepLogprobs* lp) {
                                               runs[i].logprobs.push_back(lp ? lp->all.clone() : at::Tensor());
                                               return true;
                                             });
    std::vector<Sequence*> live;
    for (auto& s : seqs)
      if (s && !s->done()) live.push_back(s.get());
    bool all_started = std::all_of(seqs.begin(), seqs.end(), [](const auto& s) { return s != nullptr; });
    if (live.empty() && all_started) break;
    together = std::max<int>(together, static_cast<int>(live.size()));
    if (!live.empty()) step(model, live, 8);
  }
  for (size_t i = 0; i < seqs.size(); ++i) runs[i].tokens = seqs[i]->result().tokens;
  if (max_together) *max_together = together;
  return runs;
}

// `tol` bounds the logprob difference: batched rows run the same ops on a [B, ...] tensor, which a
// BLAS may sum in another order; 1e-5 holds for the llama family on both libtorch builds.
void expect_same(const std::vector<Trace>& got, const std::vector<Trace>& want, double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << "sequence " << i;
    for (size_t t = 0; t < got[i].logprobs.size(); ++t)
      EXPECT_LT((got[i].logprobs[t] - want[i].logprobs[t]).abs().max().item<double>(), tol)
          << "sequence " << i << " token " << t;
  }
}

TEST(Batch, RaggedSequencesJoiningMidwayEqualEachAlone) {
  for (const char* variant : {"llama", "sliding"}) {
    SCOPED_TRACE(variant);
    nlohmann::json patch = std::string(variant) == "sliding"
                               ? nlohmann::json{{"model_type", "mistral"}, {"sliding_window", 6}}
                               : nlohmann::json::object();
    auto model = random_llama(tiny_llama_config(patch), at::kFloat, 3);
    ASSERT_TRUE(model->ragged_batches());
    std::vector<std::vector<int64_t>> prompts{prompt_of(3, 1), prompt_of(17, 2), prompt_of(10, 3), prompt_of(30, 4)};
    std::vector<GenerateOptions> opts{options(12), options(9), options(14), options(5)};
    std::vector<Trace> want;
    for (size_t i = 0; i < prompts.size(); ++i) want.push_back(alone(*model, prompts[i], opts[i]));
    int together = 0;
    auto got = batched(*model, prompts, opts, {0, 0, 4, 7}, {{}, {}, {}, {}}, &together);
    EXPECT_GE(together, 3);  // they really ran together
    expect_same(got, want);
  }
}

TEST(Batch, RowsWithDifferentAdaptersAndSeedsEqualEachAlone) {
  auto model = random_llama(tiny_llama_config(), at::kFloat, 5);
  at::manual_seed(11);
  for (const char* id : {"a", "b"})
    for (auto& [name, lin] : model->linear_modules()) {
      if (name == "lm_head") continue;
      lin->add_adapter(id, nn::LoraAdapter{at::randn({4, lin->in_features()}) * 0.3,
                                           at::randn({lin->out_features(), 4}) * 0.3, 0.8});
    }
  std::vector<std::vector<std::string>> adapters{{"a"}, {"b"}, {}, {"a", "b"}, {"b", "a"}};
  std::vector<std::vector<int64_t>> prompts;
  std::vector<GenerateOptions> opts;
  std::vector<Trace> want;
  for (size_t i = 0; i < adapters.size(); ++i) {
    prompts.push_back(prompt_of(5 + 3 * static_cast<int64_t>(i), 10 + static_cast<int64_t>(i)));
    opts.push_back(options(10, /*temperature=*/i % 2 ? 1.0 : 0.0, /*seed=*/100 + i));
    want.push_back(alone(*model, prompts[i], opts[i], adapters[i]));
  }
  // The adapters change the output (else this test could not fail).
  EXPECT_NE(want[0].tokens, alone(*model, prompts[0], opts[0]).tokens);
  auto got = batched(*model, prompts, opts, {0, 0, 0, 1, 2}, adapters);
  expect_same(got, want);
}

// A family that does not take ragged batches is stepped one forward per sequence, same results.
class NoRagged : public models::llama::LlamaModel {
 public:
  using LlamaModel::LlamaModel;
  bool ragged_batches() const override { return false; }
};

TEST(Batch, AFamilyWithoutRaggedBatchesRunsOneForwardPerSequence) {
  auto cfg = models::llama::LlamaConfig::from_json(tiny_llama_config(), "config.json");
  nn::TensorMapSource src(hearth::testing::random_llama_weights(cfg, 7));
  NoRagged model(cfg, src, std::nullopt, nn::LoadOptions{at::kCPU, at::kFloat});
  std::vector<std::vector<int64_t>> prompts{prompt_of(4, 1), prompt_of(9, 2)};
  std::vector<GenerateOptions> opts{options(8), options(6)};
  std::vector<Trace> want{alone(model, prompts[0], opts[0]), alone(model, prompts[1], opts[1])};
  expect_same(batched(model, prompts, opts, {0, 0}, {{}, {}}), want);
}

TEST(Batch, HybridStateRowsOfQwen3_5EqualEachAlone) {
  // Recurrent (gated DeltaNet) and KV layers, each row with its own state: the hybrid batches too.
  for (const char* variant : {"q35_tied_hv2", "q35_untied_hv1_mqa"}) {
    SCOPED_TRACE(variant);
    auto model = models::load_model(std::filesystem::path(HEARTH_SOURCE_DIR) / "tests/golden/models/qwen3_5" / variant,
                                    {at::kCPU, at::kFloat});
    ASSERT_TRUE(model->ragged_batches());
    const int64_t V = model->vocab_size();
    auto prompt = [&](int64_t n, int64_t seed) {
      std::vector<int64_t> p;
      for (int64_t i = 0; i < n; ++i) p.push_back((seed * 31 + i * 17 + 5) % V);
      return p;
    };
    std::vector<std::vector<int64_t>> prompts{prompt(5, 1), prompt(19, 2), prompt(11, 3)};
    std::vector<GenerateOptions> opts{options(10), options(7), options(12)};
    std::vector<Trace> want;
    for (size_t i = 0; i < prompts.size(); ++i) want.push_back(alone(*model, prompts[i], opts[i]));
    int together = 0;
    auto got = batched(*model, prompts, opts, {0, 0, 3}, {{}, {}, {}}, &together);
    EXPECT_GE(together, 3);
    // These random models' logits are large (|logit| ~ 8): PyTorch 2.11's CPU kernels (MKL) put
    // batched rows 3.3e-5 from alone ones (libtorch 1.13 + OpenBLAS on an AVX-512 Intel: < 1e-5;
    // on an AMD EPYC without AVX-512: 1.4e-4, OpenBLAS picking other kernels per row count); tokens
    // stay identical. A row reading another's state would be off by ~1.
    expect_same(got, want, 3e-4);
  }
}

// A constraint that gives up after `steps` tokens, as a grammar that outgrows its limits does.
class FailingConstraint : public TokenConstraint {
 public:
  explicit FailingConstraint(int steps) : left_(steps) {}
  void mask(at::Tensor&) override {
    if (left_-- <= 0) throw Error("grammar: the automaton needs more states than allowed");
  }
  void accept(int64_t) override {}
  bool complete() const override { return false; }

 private:
  int left_;
};

TEST(Batch, ASequenceWhoseSamplingFailsEndsAloneAndTheOthersGoOn) {
  auto model = random_llama(tiny_llama_config(), at::kFloat, 9);
  std::vector<std::vector<int64_t>> prompts{prompt_of(6, 1), prompt_of(9, 2), prompt_of(4, 3)};
  std::vector<GenerateOptions> opts{options(10), options(10), options(10)};
  std::vector<Trace> want{alone(*model, prompts[0], opts[0]), {}, alone(*model, prompts[2], opts[2])};
  opts[1].sampling.constraint = std::make_shared<FailingConstraint>(3);
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<Trace> got(3);
  for (size_t i = 0; i < 3; ++i)
    seqs.push_back(std::make_unique<Sequence>(prompts[i], opts[i], cache::Caches{}, std::vector<std::string>{},
                                              [&got, i](int64_t, const StepLogprobs* lp) {
                                                got[i].logprobs.push_back(lp ? lp->all.clone() : at::Tensor());
                                                return true;
                                              }));
  for (;;) {
    std::vector<Sequence*> live;
    for (auto& s : seqs)
      if (!s->done()) live.push_back(s.get());
    if (live.empty()) break;
    ASSERT_NO_THROW(step(*model, live, 8));
  }
  EXPECT_NE(seqs[1]->error().find("grammar"), std::string::npos);
  EXPECT_EQ(seqs[1]->result().tokens.size(), 3u);  // three tokens, then its fourth mask threw
  for (size_t i : {0u, 2u}) {
    EXPECT_TRUE(seqs[i]->error().empty());
    got[i].tokens = seqs[i]->result().tokens;
    expect_same({got[i]}, {want[i]});
  }
}

TEST(Batch, ARaggedViewNeedsEveryRowAndARowsCacheHasNoSingleOffset) {
  auto model = random_llama(tiny_llama_config());
  cache::Caches a = model->make_cache(), b = model->make_cache();
  cache::Caches view = cache::rows_view({&a, &b});
  ASSERT_EQ(view.size(), 2u);
  EXPECT_THROW(view[0]->offset(), Error);
  // A view of two rows for a batch of three is refused with a message, not a crash.
  at::Tensor ids = at::zeros({3, 1}, at::kLong);
  EXPECT_THROW(model->forward(ids, models::Positions{{0, 0, 0}}, &view), Error);
  // Rows at different positions without a ragged view are refused as before.
  cache::Caches shared = model->make_cache();
  EXPECT_THROW(model->forward(at::zeros({2, 1}, at::kLong), models::Positions{{0, 1}}, &shared), Error);
}

// Counts the token positions the model embeds (prefill and decode).
class CountingLlama : public models::llama::LlamaModel {
 public:
  using LlamaModel::LlamaModel;
  models::Boundary embed(const at::Tensor& input_ids) override {
    embedded += input_ids.numel();
    return LlamaModel::embed(input_ids);
  }
  int64_t embedded = 0;
};

TEST(Batch, ChoicesSharingOnePrefillEqualEachAloneAndPrefillOnce) {
  auto cfg = models::llama::LlamaConfig::from_json(tiny_llama_config(), "config.json");
  nn::TensorMapSource src(hearth::testing::random_llama_weights(cfg, 9));
  CountingLlama model(cfg, src, std::nullopt, nn::LoadOptions{at::kCPU, at::kFloat});
  const std::vector<int64_t> prompt = prompt_of(21, 5);  // three prefill chunks of 8
  const int64_t M = 7;
  std::vector<GenerateOptions> opts{options(M, 1.0, 41), options(M, 1.0, 42), options(M, 1.0, 43)};
  std::vector<Trace> want;
  for (const auto& o : opts) want.push_back(alone(model, prompt, o));
  EXPECT_TRUE(want[0].tokens != want[1].tokens || want[1].tokens != want[2].tokens);  // the seeds matter

  std::vector<Trace> got(3);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (size_t i = 0; i < 3; ++i)
    seqs.push_back(std::make_unique<Sequence>(prompt, opts[i], cache::Caches{}, std::vector<std::string>{},
                                              [&got, i](int64_t, const StepLogprobs* lp) {
                                                got[i].logprobs.push_back(lp ? lp->all.clone() : at::Tensor());
                                                return true;
                                              }));
  seqs[0]->share_prefill(*seqs[1]);
  seqs[0]->share_prefill(*seqs[2]);
  EXPECT_THROW(seqs[0]->share_prefill(*seqs[0]), Error);
  model.embedded = 0;
  for (;;) {
    std::vector<Sequence*> live;
    for (auto& s : seqs)
      if (!s->done()) live.push_back(s.get());
    if (live.empty()) break;
    EXPECT_FALSE(seqs[1]->prefilling());  // a child never prefills
    step(model, live, 8);
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(seqs[i]->error().empty()) << seqs[i]->error();
    got[i].tokens = seqs[i]->result().tokens;
  }
  expect_same(got, want);
  // The prompt once, then every choice's fed-back tokens (the last sampled one is never fed).
  EXPECT_EQ(model.embedded, static_cast<int64_t>(prompt.size()) + 3 * (M - 1));

  // A child whose parent is dropped before the prefill ends is ended with an error, not left waiting.
  auto parent = std::make_unique<Sequence>(prompt, opts[0], cache::Caches{}, std::vector<std::string>{}, nullptr);
  Sequence child(prompt, opts[1], cache::Caches{}, {}, nullptr);
  parent->share_prefill(child);
  parent.reset();
  EXPECT_TRUE(child.done());
  EXPECT_FALSE(child.error().empty());
}

}  // namespace
}  // namespace hearth::generate
