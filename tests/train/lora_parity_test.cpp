// LoRA gradients vs PEFT 0.21 (tests/golden/lora/<variant>: adapter, batch.json, grads.safetensors),
// CPU fp32, plain and segmented backward; segmented == full for every LoRA parameter on the tiny
// models and a random 7-layer model.
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include "adapters/adapter.h"
#include "adapters/mount.h"
#include "io/safetensors.h"
#include "nn/linear.h"
#include "train/loss.h"
#include "train/segmented.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace hearth::train;
using namespace hearth::train::testing;

namespace {

struct LoraModel {
  std::unique_ptr<hearth::models::Model> model;
  hearth::adapters::Adapter adapter;
  std::vector<TrainableParam> params;
};

}  // namespace

class LoraParity : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraParity, GradsMatchPeft) {
  const std::string v = GetParam();
  auto model = hearth::models::load_model(golden("models/" + v), {});
  auto gold_adapter = hearth::adapters::load_adapter(golden("lora/" + v));
  hearth::adapters::LoraConfig lc;
  lc.rank = 4;
  lc.scale = 8.0 / 4.0;  // lora_alpha / r
  auto adapter = hearth::adapters::attach_trainable(*model, lc, 0, "train");
  ASSERT_EQ(adapter.modules.size(), gold_adapter.modules.size());
  {
    c10::NoGradGuard ng;
    for (auto& [path, ad] : adapter.modules) {
      const auto& g = gold_adapter.modules.at(path);
      ad.a.copy_(g.a);
      ad.b.copy_(g.b);
    }
  }
  hearth::nn::ActiveAdapters active({"train"});
  auto params = lora_params(adapter);
  LayerStack stack = make_layer_stack(*model, params);
  auto [ids, labels] = golden_batch(golden("lora/" + v + "/batch.json"));
  const double ref_loss = hearth::io::read_json(golden("lora/" + v + "/batch.json"))["loss"].get<double>();
  auto grads = hearth::io::SafetensorsFile::open(golden("lora/" + v + "/grads.safetensors"));
  EXPECT_EQ(grads->tensors().size(), params.size());
  for (int64_t seg : {0, 1}) {
    zero(params);
    BackwardOptions o;
    o.segment_size = seg;
    BackwardResult r = backward(stack, ids, shift_labels(labels), o);
    const double loss = r.loss_sum / r.n_tokens;
    EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss) << v << " segment " << seg;
    double worst = 0;
    for (const auto& p : params) {
      const std::string suffix = p.name.substr(p.name.size() - 6);  // lora_A / lora_B
      const std::string module = p.name.substr(0, p.name.size() - 7);
      const std::string peft = "base_model.model." + module + "." + suffix + ".default.weight";
      ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
      const double e = rel_err(p.tensor.grad(), grads->tensor(peft));
      EXPECT_LT(e, 1e-5) << v << " " << p.name << " segment " << seg;
      worst = std::max(worst, e);
    }
    std::printf("[lora parity] %s segment %lld: loss %.8f (PEFT %.8f), worst grad rel err %.3g\n", v.c_str(),
                static_cast<long long>(seg), loss, ref_loss, worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, LoraParity, ::testing::Values("llama_mha", "llama_gqa_tied", "llama_bias", "qwen3"));

TEST(LoraSegmented, SegmentedEqualsFullOnModels) {
  struct Case {
    std::string name;
    std::unique_ptr<hearth::models::Model> model;
    std::vector<int64_t> sizes;
  };
  std::vector<Case> cases;
  for (const char* v : {"llama_mha", "qwen3"})
    cases.push_back({v, hearth::models::load_model(golden(std::string("models/") + v), {}), {1, 2}});
  cases.push_back({"random7", random_llama(7, 5), {1, 2, 3, 7}});
  for (auto& c : cases) {
    hearth::adapters::LoraConfig lc;
    lc.rank = 4;
    lc.scale = 2.0;
    auto adapter = hearth::adapters::attach_trainable(*c.model, lc, 1, "train");
    {
      c10::NoGradGuard ng;  // B = 0 at init would make every A gradient zero: randomize B
      for (auto& [path, ad] : adapter.modules) ad.b.normal_(0, 0.1);
    }
    hearth::nn::ActiveAdapters active({"train"});
    auto params = lora_params(adapter);
    LayerStack stack = make_layer_stack(*c.model, params);
    at::manual_seed(2);
    at::Tensor ids = at::randint(0, 90, {2, 11}, at::kLong);
    at::Tensor labels = ids.clone();
    labels.index_put_({0, at::indexing::Slice(0, 4)}, kIgnoreIndex);
    at::Tensor targets = shift_labels(labels);
    zero(params);
    BackwardOptions o;
    BackwardResult ref = backward(stack, ids, targets, o);
    std::vector<at::Tensor> ref_grads;
    for (const auto& p : params) ref_grads.push_back(p.tensor.grad().clone());
    for (int64_t s : c.sizes) {
      zero(params);
      o.segment_size = s;
      backward(stack, ids, targets, o);
      double worst = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        const double e = rel_err(params[i].tensor.grad(), ref_grads[i]);
        EXPECT_LT(e, 1e-6) << c.name << " " << params[i].name << " segment " << s;
        worst = std::max(worst, e);
      }
      std::printf("[segmented lora] %s segment %lld: worst rel err %.3g\n", c.name.c_str(), static_cast<long long>(s),
                  worst);
    }
  }
}
