// Batched prefill (generate/batch.h step()) on tiny random llama models and the Qwen3.5 goldens, CPU
// fp32: several sequences' prompt chunks in one forward per chunk-round — different lengths,
// prompt-cache prefixes, a LoRA row, snapshots, shared-prefill choices — give each one's logprobs,
// tokens and caches alone. Not the decode batching (batch_test.cpp) or the server's loop.
#include <gtest/gtest.h>

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>

#include "../models/random_llama.h"
#include "generate/batch.h"
#include "models/registry.h"
#include "nn/linear.h"
#include "test_paths.h"

namespace hearth::generate {
namespace {

// Records the input_ids shape of every forward (one embed per forward).
class PrefillShapesLlama : public models::llama::LlamaModel {
 public:
  using LlamaModel::LlamaModel;
  models::Boundary embed(const at::Tensor& input_ids) override {
    forwards.push_back(input_ids.sizes().vec());
    return LlamaModel::embed(input_ids);
  }
  std::vector<std::vector<int64_t>> forwards;
};

// The same model as a family that does not take ragged batches.
class PrefillShapesNoRagged : public PrefillShapesLlama {
 public:
  using PrefillShapesLlama::PrefillShapesLlama;
  bool ragged_batches() const override { return false; }
};

template <class M = PrefillShapesLlama>
std::unique_ptr<M> prefill_shapes_llama(const nlohmann::json& patch, uint64_t seed) {
  auto cfg = models::llama::LlamaConfig::from_json(hearth::testing::tiny_llama_config(patch), "config.json");
  nn::TensorMapSource src(hearth::testing::random_llama_weights(cfg, seed));
  return std::make_unique<M>(cfg, src, std::nullopt, nn::LoadOptions{at::kCPU, at::kFloat});
}

std::vector<int64_t> prefill_prompt(int64_t len, int64_t seed, int64_t vocab = 64) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back((seed * 7 + i * 13 + 3) % vocab);
  return p;
}

// One sequence of a test: its prompt, how many of its first tokens a prompt-cache hit holds, its
// adapters, and a snapshot interval (0: none).
struct PrefillSpec {
  std::vector<int64_t> prompt;
  int64_t cached = 0;
  std::vector<std::string> adapters;
  int64_t snapshot_every = 0;
};

struct PrefillRun {
  std::vector<int64_t> tokens;
  std::vector<at::Tensor> logprobs;
  cache::Caches caches;
  std::vector<std::pair<int64_t, int64_t>> snapshots;  // (tokens, the snapshot's offset)
};

GenerateOptions prefill_options(int64_t max_tokens) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = 0.0;
  o.logprobs = true;
  o.prefill_step_size = 8;
  return o;
}

// Caches holding the first `n` prompt tokens, prefilled alone (what a prompt-cache hit hands over).
cache::Caches prefill_prefix(models::Model& model, const PrefillSpec& spec) {
  if (spec.cached == 0) return {};
  c10::NoGradGuard no_grad;
  cache::Caches c = model.make_cache();
  nn::ActiveAdapters scope(spec.adapters);
  model.forward(at::tensor(std::vector<int64_t>(spec.prompt.begin(), spec.prompt.begin() + spec.cached),
                           at::TensorOptions().dtype(at::kLong))
                    .view({1, spec.cached}),
                0, &c);
  return c;
}

// Runs `specs` through step(): all together (each step gets every live sequence) or each alone.
// `watched` (the model itself, when it records forwards) forgets the prompt-cache prefixes' forwards.
std::vector<PrefillRun> prefill_run(models::Model& model, const std::vector<PrefillSpec>& specs, bool together,
                                    int64_t budget = 256, int64_t max_tokens = 6,
                                    PrefillShapesLlama* watched = nullptr) {
  std::vector<PrefillRun> runs(specs.size());
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (size_t i = 0; i < specs.size(); ++i) {
    seqs.push_back(std::make_unique<Sequence>(specs[i].prompt, prefill_options(max_tokens), prefill_prefix(model, specs[i]),
                                              specs[i].adapters, [&runs, i](int64_t, const StepLogprobs* lp) {
                                                runs[i].logprobs.push_back(lp ? lp->all.clone() : at::Tensor());
                                                return true;
                                              }));
    if (specs[i].snapshot_every > 0)
      seqs[i]->on_snapshot(specs[i].snapshot_every, [&runs, i](int64_t tokens, cache::Caches snap) {
        runs[i].snapshots.emplace_back(tokens, cache::offset_of(snap));
      });
  }
  if (watched) watched->forwards.clear();
  auto drive = [&](const std::vector<Sequence*>& group) {
    for (;;) {
      std::vector<Sequence*> live;
      for (Sequence* s : group)
        if (!s->done()) live.push_back(s);
      if (live.empty()) return;
      step(model, live, budget);
    }
  };
  if (together) {
    std::vector<Sequence*> all;
    for (auto& s : seqs) all.push_back(s.get());
    drive(all);
  } else {
    for (auto& s : seqs) drive({s.get()});
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_TRUE(seqs[i]->error().empty()) << seqs[i]->error();
    runs[i].tokens = seqs[i]->result().tokens;
    runs[i].caches = std::move(seqs[i]->caches());
  }
  return runs;
}

// Same tokens, logprobs within `tol` (the first one is the prefill's), same snapshots, and caches
// holding the same tokens' keys/values (no padding left in them).
void expect_prefill_same(const std::vector<PrefillRun>& got, const std::vector<PrefillRun>& want, double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "sequence " << i);
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size());
    ASSERT_FALSE(got[i].logprobs.empty());
    for (size_t t = 0; t < got[i].logprobs.size(); ++t)
      EXPECT_TRUE(at::allclose(got[i].logprobs[t], want[i].logprobs[t], 0.0, tol))
          << "token " << t << ": " << (got[i].logprobs[t] - want[i].logprobs[t]).abs().max().item<double>();
    EXPECT_EQ(got[i].snapshots, want[i].snapshots);
    ASSERT_EQ(got[i].caches.size(), want[i].caches.size());
    EXPECT_EQ(cache::offset_of(got[i].caches), cache::offset_of(want[i].caches));
    for (size_t l = 0; l < got[i].caches.size(); ++l) {
      auto* g = dynamic_cast<cache::KVCache*>(got[i].caches[l].get());
      auto* w = dynamic_cast<cache::KVCache*>(want[i].caches[l].get());
      if (!g || !w) continue;
      const int64_t n = w->offset();
      EXPECT_TRUE(at::allclose(g->keys_buffer().narrow(2, 0, n), w->keys_buffer().narrow(2, 0, n), 0.0, tol));
      EXPECT_TRUE(at::allclose(g->values_buffer().narrow(2, 0, n), w->values_buffer().narrow(2, 0, n), 0.0, tol));
    }
  }
}

// Sets HEARTH_BATCH_PREFILL for one scope (unset: step()'s default, off), then restores it.
class PrefillEnvScope {
 public:
  explicit PrefillEnvScope(const char* value) {
    if (const char* v = std::getenv("HEARTH_BATCH_PREFILL")) saved_ = v;
    if (value) setenv("HEARTH_BATCH_PREFILL", value, 1);
    else unsetenv("HEARTH_BATCH_PREFILL");
  }
  ~PrefillEnvScope() {
    if (saved_) setenv("HEARTH_BATCH_PREFILL", saved_->c_str(), 1);
    else unsetenv("HEARTH_BATCH_PREFILL");
  }

 private:
  std::optional<std::string> saved_;
};

// These models run on the CPU, where batched prefill is off by default: each test turns it on.
class BatchPrefill : public ::testing::Test {
 protected:
  PrefillEnvScope on_{"1"};
};

TEST_F(BatchPrefill, RowsOfDifferentLengthsPrefixesAdaptersAndSnapshotsEqualEachAlone) {
  auto model = prefill_shapes_llama(nlohmann::json::object(), 21);
  ASSERT_TRUE(model->ragged_batches());
  at::manual_seed(5);
  for (auto& [name, lin] : model->linear_modules())  // lm_head too: the head runs on the completing rows only
    lin->add_adapter("a", nn::LoraAdapter{at::randn({4, lin->in_features()}) * 0.3,
                                          at::randn({lin->out_features(), 4}) * 0.3, 0.8});
  const std::vector<PrefillSpec> specs{
      {prefill_prompt(5, 1)},                               // one chunk
      {prefill_prompt(13, 2)},                              // 8 + 5
      {prefill_prompt(21, 3), /*cached=*/6},                // a prompt-cache hit: 8 + 7 left
      {prefill_prompt(11, 4), /*cached=*/9},                // 2 left
      {prefill_prompt(17, 5), 0, {"a"}},                    // the LoRA row
      {prefill_prompt(14, 6), 0, {}, /*snapshot_every=*/4}  // chunks cut at 4, 8, 12
  };
  const std::vector<PrefillRun> want = prefill_run(*model, specs, /*together=*/false);
  // The adapter changes the row's output (else this test could not tell rows' adapters apart).
  std::vector<PrefillSpec> plain = {specs[4]};
  plain[0].adapters.clear();
  EXPECT_FALSE(at::allclose(prefill_run(*model, plain, false)[0].logprobs[0], want[4].logprobs[0], 0.0, 1e-3));
  EXPECT_EQ(want[5].snapshots, (std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 8}, {12, 12}, {14, 14}}));

  expect_prefill_same(prefill_run(*model, specs, /*together=*/true, 256, 6, model.get()), want);
  // The first step's prefill is four chunk-rounds, one forward each (the snapshot row's 14 tokens are
  // chunks of 4, 4, 4, 2), where each sequence alone took one forward per chunk (14 in all).
  ASSERT_GE(model->forwards.size(), 5u);
  EXPECT_EQ(model->forwards[0], (std::vector<int64_t>{6, 8}));  // every sequence, padded to 8
  EXPECT_EQ(model->forwards[1], (std::vector<int64_t>{4, 8}));  // 13's 5, 21's 7, 17's 8, 14's 4
  EXPECT_EQ(model->forwards[2], (std::vector<int64_t>{2, 4}));  // 17's 1, 14's 4
  EXPECT_EQ(model->forwards[3], (std::vector<int64_t>{1, 2}));  // 14's 2
  EXPECT_EQ(model->forwards[4], (std::vector<int64_t>{6, 1}));  // the first decode step
}

// Plain-greedy rows without logprobs take their first token from the batch's one argmax (and the
// rows at one position attend in one call): the same tokens and caches as each alone.
TEST_F(BatchPrefill, PlainGreedyRowsWithoutLogprobsEqualEachAlone) {
  auto model = prefill_shapes_llama(nlohmann::json::object(), 23);
  const std::vector<std::vector<int64_t>> prompts{prefill_prompt(5, 1), prefill_prompt(8, 2), prefill_prompt(8, 3),
                                                  prefill_prompt(3, 4)};
  auto run = [&](bool together) {
    GenerateOptions o = prefill_options(5);
    o.logprobs = false;
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<Sequence*> all;
    for (const auto& p : prompts) {
      seqs.push_back(std::make_unique<Sequence>(p, o, cache::Caches{}, std::vector<std::string>{}, StepCallback{}));
      all.push_back(seqs.back().get());
    }
    auto drive = [&](const std::vector<Sequence*>& group) {
      for (;;) {
        std::vector<Sequence*> live;
        for (Sequence* s : group)
          if (!s->done()) live.push_back(s);
        if (live.empty()) return;
        step(*model, live, 256);
      }
    };
    if (together) drive(all);
    else
      for (Sequence* s : all) drive({s});
    std::vector<std::pair<std::vector<int64_t>, at::Tensor>> out;
    for (Sequence* s : all) {
      auto* kv = dynamic_cast<cache::KVCache*>(s->caches()[0].get());
      out.emplace_back(s->result().tokens, kv->keys_buffer().narrow(2, 0, kv->offset()).clone());
    }
    return out;
  };
  const auto want = run(false);
  model->forwards.clear();
  const auto got = run(true);
  EXPECT_EQ(model->forwards.front(), (std::vector<int64_t>{4, 8}));  // one padded prefill forward
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << "sequence " << i;
    EXPECT_EQ(got[i].first.size(), 5u);
    EXPECT_TRUE(at::allclose(got[i].second, want[i].second, 0.0, 1e-5)) << "sequence " << i;
  }
}

TEST_F(BatchPrefill, OneForwardPerChunkRoundNotPerSequence) {
  auto model = prefill_shapes_llama(nlohmann::json::object(), 22);
  // Eight requests arriving together, each prompt one chunk: ONE prefill forward, then one decode.
  std::vector<PrefillSpec> eight;
  for (int64_t i = 0; i < 8; ++i) eight.push_back({prefill_prompt(3 + i % 6, 10 + i)});
  std::vector<PrefillRun> want = prefill_run(*model, eight, false, 256, 3);
  expect_prefill_same(prefill_run(*model, eight, true, 256, 3, model.get()), want);
  ASSERT_EQ(model->forwards.size(), 3u);  // prefill, then two decode steps for 3 tokens
  EXPECT_EQ(model->forwards[0], (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(model->forwards[1], (std::vector<int64_t>{8, 1}));

  // Chunks [5], [8, 5], [8, 8, 5] and a hit leaving [8]: three rounds, not seven forwards.
  const std::vector<PrefillSpec> specs{
      {prefill_prompt(5, 1)}, {prefill_prompt(13, 2)}, {prefill_prompt(21, 3)}, {prefill_prompt(20, 4), 12}};
  want = prefill_run(*model, specs, false);
  expect_prefill_same(prefill_run(*model, specs, true, 256, 6, model.get()), want);
  ASSERT_GE(model->forwards.size(), 4u);
  EXPECT_EQ(model->forwards[0], (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(model->forwards[1], (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(model->forwards[2], (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(model->forwards[3], (std::vector<int64_t>{4, 1}));  // the first decode step: all four

  // A padded forward holds at most max(budget, longest chunk) positions: 6 + 6 + 3 tokens fit a
  // budget of 16, but three rows padded to 6 (18) do not; the third runs in a forward of its own.
  const std::vector<PrefillSpec> small{{prefill_prompt(6, 1)}, {prefill_prompt(3, 2)}, {prefill_prompt(6, 3)}};
  want = prefill_run(*model, small, false, 16);
  expect_prefill_same(prefill_run(*model, small, true, 16, 6, model.get()), want);
  ASSERT_GE(model->forwards.size(), 2u);
  EXPECT_EQ(model->forwards[0], (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(model->forwards[1], (std::vector<int64_t>{1, 3}));
}

TEST_F(BatchPrefill, SlidingWindowRowsShareAForwardOnlyAtEqualLengths) {
  // A sliding window's cache cannot trim padding back: rows of equal chunk length still go together.
  auto model = prefill_shapes_llama({{"model_type", "mistral"}, {"sliding_window", 6}}, 23);
  const std::vector<PrefillSpec> specs{{prefill_prompt(8, 1)}, {prefill_prompt(5, 2)}, {prefill_prompt(8, 3)}};
  const std::vector<PrefillRun> want = prefill_run(*model, specs, false);
  expect_prefill_same(prefill_run(*model, specs, true, 256, 6, model.get()), want);
  ASSERT_GE(model->forwards.size(), 2u);
  EXPECT_EQ(model->forwards[0], (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(model->forwards[1], (std::vector<int64_t>{1, 5}));
}


TEST_F(BatchPrefill, AFamilyWithoutRaggedBatchesTheCpuDefaultOrTheSwitchOffPrefillOneSequencePerForward) {
  const std::vector<PrefillSpec> specs{{prefill_prompt(8, 1)}, {prefill_prompt(5, 2)}, {prefill_prompt(8, 3)}};
  auto no_ragged = prefill_shapes_llama<PrefillShapesNoRagged>(nlohmann::json::object(), 24);
  auto cpu_default = prefill_shapes_llama(nlohmann::json::object(), 24);
  auto switched_off = prefill_shapes_llama(nlohmann::json::object(), 24);
  for (PrefillShapesLlama* model : {static_cast<PrefillShapesLlama*>(no_ragged.get()), cpu_default.get(), switched_off.get()}) {
    std::optional<PrefillEnvScope> env;
    if (model == cpu_default.get()) env.emplace(nullptr);
    if (model == switched_off.get()) env.emplace("0");
    const std::vector<PrefillRun> want = prefill_run(*model, specs, false);
    expect_prefill_same(prefill_run(*model, specs, true, 256, 6, model), want);
    ASSERT_GE(model->forwards.size(), 3u);
    EXPECT_EQ(model->forwards[0], (std::vector<int64_t>{1, 8}));
    EXPECT_EQ(model->forwards[1], (std::vector<int64_t>{1, 5}));
    EXPECT_EQ(model->forwards[2], (std::vector<int64_t>{1, 8}));
  }
}

TEST_F(BatchPrefill, ChoicesSharingAPrefillThatRanInAPaddedForwardEqualEachAlone) {
  // A request with n = 3 (one prefill, three samplers) prefilled beside two others.
  auto model = prefill_shapes_llama(nlohmann::json::object(), 25);
  const std::vector<int64_t> shared = prefill_prompt(13, 7);
  const std::vector<std::vector<int64_t>> prompts{prefill_prompt(9, 1), shared, shared, shared, prefill_prompt(5, 2)};
  std::vector<GenerateOptions> opts;
  for (uint64_t i = 0; i < prompts.size(); ++i) {
    opts.push_back(prefill_options(6));
    opts.back().sampling.temperature = 1.0;
    opts.back().sampling.seed = 40 + i;
  }
  auto sequences = [&](std::vector<PrefillRun>& runs) {
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (size_t i = 0; i < prompts.size(); ++i)
      seqs.push_back(std::make_unique<Sequence>(prompts[i], opts[i], cache::Caches{}, std::vector<std::string>{},
                                                [&runs, i](int64_t, const StepLogprobs* lp) {
                                                  runs[i].logprobs.push_back(lp ? lp->all.clone() : at::Tensor());
                                                  return true;
                                                }));
    return seqs;
  };
  auto finish = [](std::vector<std::unique_ptr<Sequence>>& seqs, std::vector<PrefillRun>& runs) {
    for (size_t i = 0; i < seqs.size(); ++i) {
      EXPECT_TRUE(seqs[i]->error().empty()) << seqs[i]->error();
      runs[i].tokens = seqs[i]->result().tokens;
      runs[i].caches = std::move(seqs[i]->caches());
    }
  };
  std::vector<PrefillRun> want(prompts.size());
  auto alone = sequences(want);
  for (auto& s : alone)
    while (!s->done()) step(*model, {s.get()}, 256);
  finish(alone, want);
  EXPECT_NE(want[1].tokens, want[2].tokens);  // the choices' seeds matter

  std::vector<PrefillRun> got(prompts.size());
  auto seqs = sequences(got);
  seqs[1]->share_prefill(*seqs[2]);
  seqs[1]->share_prefill(*seqs[3]);
  model->forwards.clear();
  for (;;) {
    std::vector<Sequence*> live;
    for (auto& s : seqs)
      if (!s->done()) live.push_back(s.get());
    if (live.empty()) break;
    step(*model, live, 256);
  }
  finish(seqs, got);
  expect_prefill_same(got, want);
  // Chunks 8 + 1, 8 + 5 (shared), 5: two rounds, then all five rows decode together.
  ASSERT_GE(model->forwards.size(), 3u);
  EXPECT_EQ(model->forwards[0], (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(model->forwards[1], (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(model->forwards[2], (std::vector<int64_t>{5, 1}));
}

TEST_F(BatchPrefill, ARowIsNotPaddedPastTheBuffersItReachesAlone) {
  // Chunks of 300, 5 and 20 tokens, generating 4, 3 and 300. The 5-token row alone never holds more
  // than 8 tokens (a 256-token buffer: the caches' growth step, the server's charge for it); padded
  // to 300 its buffers would grow to 512 and the trim would keep them. So it prefills in a forward
  // of its own, while the 20-token row (up to 320 tokens: 512 anyway) shares the 300-token forward.
  auto model = prefill_shapes_llama({{"max_position_embeddings", 1024}}, 26);
  const std::vector<std::pair<int64_t, int64_t>> shapes{{300, 4}, {5, 3}, {20, 300}};  // prompt, max_tokens
  auto sequences = [&](std::vector<PrefillRun>& runs) {
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      GenerateOptions o = prefill_options(shapes[i].second);
      o.prefill_step_size = 512;
      seqs.push_back(std::make_unique<Sequence>(prefill_prompt(shapes[i].first, static_cast<int64_t>(i)), o,
                                                cache::Caches{}, std::vector<std::string>{},
                                                [&runs, i](int64_t, const StepLogprobs* lp) {
                                                  runs[i].logprobs.push_back(lp ? lp->all.clone() : at::Tensor());
                                                  return true;
                                                }));
    }
    return seqs;
  };
  auto capacities = [](Sequence& s) {
    std::vector<int64_t> caps;
    for (const auto& c : s.caches()) caps.push_back(dynamic_cast<const cache::KVCache&>(*c).capacity());
    return caps;
  };
  std::vector<PrefillRun> want(shapes.size()), got(shapes.size());
  auto alone = sequences(want);
  for (auto& s : alone)
    while (!s->done()) step(*model, {s.get()}, 1024);
  auto seqs = sequences(got);
  model->forwards.clear();
  step(*model, {seqs[0].get(), seqs[1].get(), seqs[2].get()}, 1024);
  ASSERT_EQ(model->forwards.size(), 3u);
  EXPECT_EQ(model->forwards[0], (std::vector<int64_t>{2, 300}));  // the 300- and 20-token rows
  EXPECT_EQ(model->forwards[1], (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(model->forwards[2], (std::vector<int64_t>{3, 1}));  // the first decode step: all three
  EXPECT_EQ(capacities(*seqs[0]), (std::vector<int64_t>{512, 512}));
  EXPECT_EQ(capacities(*seqs[1]), (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(capacities(*seqs[2]), (std::vector<int64_t>{512, 512}));
  while (!seqs[0]->done() || !seqs[1]->done() || !seqs[2]->done()) {
    std::vector<Sequence*> live;
    for (auto& s : seqs)
      if (!s->done()) live.push_back(s.get());
    step(*model, live, 1024);
  }
  EXPECT_EQ(capacities(*seqs[1]), (std::vector<int64_t>{256, 256}));
  for (size_t i = 0; i < seqs.size(); ++i) {
    got[i].tokens = seqs[i]->result().tokens;
    got[i].caches = std::move(seqs[i]->caches());
    want[i].tokens = alone[i]->result().tokens;
    want[i].caches = std::move(alone[i]->caches());
  }
  expect_prefill_same(got, want, 1e-4);
}

TEST_F(BatchPrefill, HybridRowsOfQwen3_5AtEqualLengthsEqualEachAlone) {
  // Recurrent states cannot trim either: equal-length chunks share a forward, others prefill alone.
  auto model = models::load_model(std::filesystem::path(HEARTH_SOURCE_DIR) / "tests/golden/models/qwen3_5/q35_tied_hv2",
                                  {at::kCPU, at::kFloat});
  const int64_t V = model->vocab_size();
  const std::vector<PrefillSpec> specs{{prefill_prompt(7, 1, V)}, {prefill_prompt(12, 2, V)}, {prefill_prompt(7, 3, V)}};
  // The tolerance of batch_test's hybrid test: these random models' logits are large.
  expect_prefill_same(prefill_run(*model, specs, true), prefill_run(*model, specs, false), 1e-4);
}

// A model whose logits are NaN (a NaN norm weight, as a broken checkpoint gives): every sequence
// ends with an error naming it, alone, padded beside others, and the choices sharing a prefill —
// not with token 0, the argmax over NaN, as a silent answer.
TEST_F(BatchPrefill, NonFiniteLogitsEndTheSequencesWithAnError) {
  auto cfg = models::llama::LlamaConfig::from_json(hearth::testing::tiny_llama_config(nlohmann::json::object()), "config.json");
  auto weights = hearth::testing::random_llama_weights(cfg, 27);
  weights["model.norm.weight"] = at::full_like(weights["model.norm.weight"], std::numeric_limits<float>::quiet_NaN());
  nn::TensorMapSource src(weights);
  PrefillShapesLlama model(cfg, src, std::nullopt, nn::LoadOptions{at::kCPU, at::kFloat});
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int64_t i = 0; i < 4; ++i)
    seqs.push_back(std::make_unique<Sequence>(prefill_prompt(5 + 3 * std::min<int64_t>(i, 2), std::min<int64_t>(i, 2)),
                                              prefill_options(4), cache::Caches{},
                                              std::vector<std::string>{},
                                              [](int64_t, const StepLogprobs*) { return true; }));
  seqs[2]->share_prefill(*seqs[3]);
  while (!seqs[0]->done()) step(model, {seqs[0].get()}, 256);  // alone
  for (;;) {  // the others padded together, one of them with a fork
    std::vector<Sequence*> live;
    for (size_t i = 1; i < seqs.size(); ++i)
      if (!seqs[i]->done()) live.push_back(seqs[i].get());
    if (live.empty()) break;
    step(model, live, 256);
  }
  for (const auto& s : seqs) {
    EXPECT_NE(s->error().find("logits for the prompt are not finite"), std::string::npos) << s->error();
    EXPECT_TRUE(s->result().tokens.empty());
  }
}

}  // namespace
}  // namespace hearth::generate
