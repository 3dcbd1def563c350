// DPO / ORPO losses, metrics and LoRA gradients (and base-weight gradients of a full fine-tune) vs
// the plain-PyTorch goldens of tools/gen_preference_goldens.py (tests/golden/preference/<variant>),
// CPU fp32, full and segmented backward; the reference pass with the adapter switched off; segmented == full on a 7-layer model;
// evaluation == the training head's loss; the loss formulas on hand-made log-probs.
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <cmath>

#include "adapters/adapter.h"
#include "adapters/mount.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "nn/linear.h"
#include "train/loss.h"
#include "train/preference.h"
#include "train/segmented.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace hearth::train;
using namespace hearth::train::testing;

namespace {

at::Tensor rows_tensor(const nlohmann::json& rows) {
  const int64_t B = rows.size(), T = rows[0].size();
  at::Tensor t = at::empty({B, T}, at::kLong);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) t[b][i] = rows[b][i].get<int64_t>();
  return t;
}

PreferenceBatch golden_pref_batch(const nlohmann::json& j) {
  PreferenceBatch b;
  b.input_ids = rows_tensor(j["input_ids"]);
  b.labels = rows_tensor(j["labels"]);
  b.full_labels = rows_tensor(j["full_labels"]);
  b.pairs = j["pairs"].get<int64_t>();
  return b;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

PreferenceOptions options_of(const std::string& c) {
  PreferenceOptions o;
  o.method = c == "dpo" ? Method::kDpo : Method::kOrpo;
  o.beta = 0.1;
  o.orpo_lambda = 0.1;
  o.sft_full = c == "orpo_full";
  o.loss_chunk = 3;  // several chunks over the golden batch's 11 positions
  return o;
}

}  // namespace

class PreferenceGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(PreferenceGolden, LossMetricsAndGradsMatchPyTorch) {
  const std::string v = GetParam();
  auto model = hearth::models::load_model(golden("models/" + v), {});
  auto gold_adapter = hearth::adapters::load_adapter(golden("lora/" + v));
  const nlohmann::json j = hearth::io::read_json(golden("preference/" + v + "/batch.json"));
  hearth::adapters::LoraConfig lc;
  lc.rank = 4;
  lc.scale = j["lora_scale"].get<double>();
  auto adapter = hearth::adapters::attach_trainable(*model, lc, 0, "train");
  {
    c10::NoGradGuard ng;
    for (auto& [path, ad] : adapter.modules) {
      ad.a.copy_(gold_adapter.modules.at(path).a);
      ad.b.copy_(gold_adapter.modules.at(path).b);
    }
  }
  hearth::nn::ActiveAdapters active({"train"});
  auto params = lora_params(adapter);
  LayerStack stack = make_layer_stack(*model, params);
  PreferenceBatch batch = golden_pref_batch(j);

  // The reference: the same model with the adapter off.
  at::Tensor ref = reference_logps(*model, batch, 4);
  ASSERT_EQ(ref.numel(), 2 * batch.pairs);
  for (int64_t i = 0; i < ref.numel(); ++i)
    EXPECT_LT(rel(ref[i].item<double>(), j["ref_logps"][i].get<double>()), 1e-5) << v << " ref row " << i;
  // The scope restores the adapter: a second policy pass is unaffected.
  EXPECT_EQ(hearth::nn::ActiveAdapters::current(), std::vector<std::string>{"train"});

  for (const auto& [name, c] : j["cases"].items()) {
    if (name.rfind("full_", 0) == 0) continue;  // PreferenceGoldenFull
    const PreferenceOptions opts = options_of(name);
    auto grads = hearth::io::SafetensorsFile::open(golden("preference/" + v + "/" + name + ".safetensors"));
    EXPECT_EQ(grads->tensors().size(), params.size());
    for (int64_t seg : {0, 1}) {
      zero(params);
      PreferenceStats st;
      BackwardOptions bo;
      bo.segment_size = seg;
      BackwardResult r = backward_with_head(
          stack, batch.input_ids,
          preference_head(batch, opts.method == Method::kDpo ? ref : at::Tensor(), opts, stack.head,
                          stack.head_params, 1.0, &st),
          bo);
      const auto& m = c["metrics"];
      EXPECT_LT(rel(st.loss, m["loss"].get<double>()), 1e-5) << v << " " << name << " seg " << seg;
      EXPECT_DOUBLE_EQ(r.loss_sum, st.loss);
      EXPECT_EQ(r.n_tokens, shift_labels(batch.labels).ne(kIgnoreIndex).sum().item<int64_t>());
      EXPECT_DOUBLE_EQ(st.accuracy, m["accuracy"].get<double>()) << v << " " << name;
      EXPECT_NEAR(st.margin, m["margin"].get<double>(), 1e-5 * std::max(1.0, std::abs(m["margin"].get<double>())))
          << v << " " << name;
      if (opts.method == Method::kOrpo) {
        EXPECT_LT(rel(st.nll, m["nll"].get<double>()), 1e-5) << v << " " << name;
        EXPECT_LT(rel(st.odds_ratio, m["or"].get<double>()), 1e-5) << v << " " << name;
      }
      double worst = 0;
      for (const auto& p : params) {
        const std::string suffix = p.name.substr(p.name.size() - 6);  // lora_A / lora_B
        const std::string module = p.name.substr(0, p.name.size() - 7);
        ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
        const double e = rel_err(p.tensor.grad(), grads->tensor("base_model.model." + module + "." + suffix + ".weight"));
        EXPECT_LT(e, 1e-5) << v << " " << name << " " << p.name << " seg " << seg;
        worst = std::max(worst, e);
      }
      std::printf("[preference golden] %s %s segment %lld: loss %.8f (torch %.8f), worst grad rel err %.3g\n",
                  v.c_str(), name.c_str(), static_cast<long long>(seg), st.loss, m["loss"].get<double>(), worst);
    }
    // Evaluation (forward only) gives the training head's loss.
    PreferenceStats ev = preference_eval(*model, batch, opts.method == Method::kDpo ? ref : at::Tensor(), opts);
    EXPECT_LT(rel(ev.loss, c["metrics"]["loss"].get<double>()), 1e-5) << v << " " << name << " eval";
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, PreferenceGolden, ::testing::Values("llama_mha", "llama_gqa_tied"));

// A full fine-tune: the head's and the embedding's own weights are trained, so the loss head's
// parameter-gradient path (and, for the tied model, the embedding used twice) is checked too.
class PreferenceGoldenFull : public ::testing::TestWithParam<std::string> {};

TEST_P(PreferenceGoldenFull, BaseWeightGradsMatchPyTorch) {
  const std::string v = GetParam();
  auto model = hearth::models::load_model(golden("models/" + v), {});
  const nlohmann::json j = hearth::io::read_json(golden("preference/" + v + "/batch.json"));
  PreferenceBatch batch = golden_pref_batch(j);
  at::Tensor ref = reference_logps(*model, batch, 4);
  auto params = full_parameters(*model, -1);
  LayerStack stack = make_layer_stack(*model, params);
  ASSERT_FALSE(stack.head_params.empty());
  for (const char* name : {"full_dpo", "full_orpo_full"}) {
    const auto& m = j["cases"][name]["metrics"];
    PreferenceOptions opts = options_of(name == std::string("full_dpo") ? "dpo" : "orpo_full");
    auto grads = hearth::io::SafetensorsFile::open(golden("preference/" + v + "/" + name + ".safetensors"));
    ASSERT_GE(grads->tensors().size(), 5u);
    for (int64_t seg : {0, 1}) {
      zero(params);
      PreferenceStats st;
      BackwardOptions bo;
      bo.segment_size = seg;
      backward_with_head(stack, batch.input_ids,
                         preference_head(batch, opts.method == Method::kDpo ? ref : at::Tensor(), opts, stack.head,
                                         stack.head_params, 1.0, &st),
                         bo);
      EXPECT_LT(rel(st.loss, m["loss"].get<double>()), 1e-5) << v << " " << name << " seg " << seg;
      EXPECT_NEAR(st.margin, m["margin"].get<double>(), 1e-5 * std::max(1.0, std::abs(m["margin"].get<double>())));
      double worst = 0;
      for (const auto& info : grads->tensors()) {
        const TrainableParam* p = nullptr;
        for (const auto& q : params)
          if (q.name == info.name) p = &q;
        ASSERT_NE(p, nullptr) << info.name;
        ASSERT_TRUE(p->tensor.grad().defined()) << info.name;
        const double e = rel_err(p->tensor.grad(), grads->tensor(info.name));
        EXPECT_LT(e, 1e-5) << v << " " << name << " " << info.name << " seg " << seg;
        worst = std::max(worst, e);
      }
      std::printf("[preference golden full] %s %s segment %lld: loss %.8f (torch %.8f), worst grad rel err %.3g\n",
                  v.c_str(), name, static_cast<long long>(seg), st.loss, m["loss"].get<double>(), worst);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, PreferenceGoldenFull, ::testing::Values("llama_mha", "llama_gqa_tied"));

TEST(PreferenceSegmented, SegmentedEqualsFullForDpoAndOrpo) {
  auto model = random_llama(7, 5);
  hearth::adapters::LoraConfig lc;
  lc.rank = 4;
  lc.scale = 2.0;
  auto adapter = hearth::adapters::attach_trainable(*model, lc, 1, "train");
  {
    c10::NoGradGuard ng;
    for (auto& [path, ad] : adapter.modules) ad.b.normal_(0, 0.1);
  }
  hearth::nn::ActiveAdapters active({"train"});
  auto params = lora_params(adapter);
  LayerStack stack = make_layer_stack(*model, params);
  at::manual_seed(3);
  PreferenceBatch batch;
  batch.pairs = 2;
  batch.input_ids = at::randint(1, 90, {4, 12}, at::kLong);
  batch.full_labels = batch.input_ids.clone();
  batch.full_labels.index_put_({3, at::indexing::Slice(9, 12)}, kIgnoreIndex);  // a shorter rejected row
  batch.input_ids.index_put_({3, at::indexing::Slice(9, 12)}, 0);
  batch.labels = batch.full_labels.clone();
  for (int64_t i = 0; i < 4; ++i) batch.labels.index_put_({i, at::indexing::Slice(0, 3 + i)}, kIgnoreIndex);
  at::Tensor ref = reference_logps(*model, batch, 5);
  for (const char* c : {"dpo", "orpo_response", "orpo_full"}) {
    PreferenceOptions o = options_of(c);
    const at::Tensor r = o.method == Method::kDpo ? ref : at::Tensor();
    std::vector<at::Tensor> full_grads;
    double full_loss = 0;
    for (int64_t seg : {0, 1, 2, 3, 7}) {
      zero(params);
      BackwardOptions bo;
      bo.segment_size = seg;
      PreferenceStats st;
      backward_with_head(stack, batch.input_ids, preference_head(batch, r, o, stack.head, stack.head_params, 0.5, &st), bo);
      if (seg == 0) {
        full_loss = st.loss;
        for (const auto& p : params) full_grads.push_back(p.tensor.grad().clone());
        EXPECT_GT(full_grads[0].abs().sum().item<double>(), 0) << c;
        continue;
      }
      EXPECT_DOUBLE_EQ(st.loss, full_loss) << c << " segment " << seg;
      double worst = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        const double e = rel_err(params[i].tensor.grad(), full_grads[i]);
        EXPECT_LT(e, 1e-6) << c << " " << params[i].name << " segment " << seg;
        worst = std::max(worst, e);
      }
      std::printf("[segmented preference] %s segment %lld: worst rel err %.3g\n", c, static_cast<long long>(seg), worst);
    }
  }
}

TEST(PreferenceLoss, FormulasOnHandMadeLogProbs) {
  // Two pairs, T = 3; rows 0,1 chosen, 2,3 rejected; response masks of 2, 1, 3, 2 tokens.
  at::Tensor logp = at::tensor({-0.5, -1.0, -9.0, -0.2, -7.0, -7.0, -2.0, -1.0, -3.0, -0.1, -0.3, -5.0}, at::kDouble)
                        .view({4, 3});
  at::Tensor resp = at::tensor({1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0}, at::kDouble).view({4, 3});
  at::Tensor ref = at::tensor({-2.0, -0.5, -5.0, -0.1}, at::kDouble);
  PreferenceOptions o;
  o.method = Method::kDpo;
  o.beta = 0.5;
  PreferenceStats st;
  at::Tensor loss = preference_loss(logp, resp, resp.narrow(0, 0, 2), ref, o, &st);
  // π = [-1.5, -0.2, -6, -0.4]; z = β((πc − πr) − (refc − refr)) = 0.5·[(4.5) − (3), (0.2) − (−0.4)] = [0.75, 0.3]
  const auto nls = [](double z) { return std::log1p(std::exp(-z)); };
  EXPECT_NEAR(loss.item<double>(), (nls(0.75) + nls(0.3)) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(st.accuracy, 1.0);
  EXPECT_NEAR(st.margin, (0.75 + 0.3) / 2, 1e-12);
  o.method = Method::kOrpo;
  o.orpo_lambda = 0.25;
  loss = preference_loss(logp, resp, resp.narrow(0, 0, 2), at::Tensor(), o, &st);
  const double lc[2] = {-0.75, -0.2}, lr[2] = {-2.0, -0.2};
  double orsum = 0, lo_sum = 0;
  for (int i = 0; i < 2; ++i) {
    const double lo = (lc[i] - lr[i]) - (std::log1p(-std::exp(lc[i])) - std::log1p(-std::exp(lr[i])));
    orsum += nls(lo);
    lo_sum += lo;
  }
  const double nll = (0.5 + 1.0 + 0.2) / 3;
  EXPECT_NEAR(st.nll, nll, 1e-12);
  EXPECT_NEAR(st.odds_ratio, orsum / 2, 1e-12);
  EXPECT_NEAR(loss.item<double>(), nll + 0.25 * orsum / 2, 1e-12);
  EXPECT_DOUBLE_EQ(st.accuracy, 0.5);  // the second pair ties: not counted as won
  EXPECT_NEAR(st.margin, lo_sum / 2, 1e-12);
  // A row predicted with certainty (ℓ = 0) stays finite.
  at::Tensor sure = logp.clone();
  sure.narrow(0, 0, 1).zero_();
  EXPECT_TRUE(std::isfinite(preference_loss(sure, resp, resp.narrow(0, 0, 2), at::Tensor(), o, nullptr).item<double>()));
  EXPECT_THROW(parse_method("ppo"), hearth::Error);
}
