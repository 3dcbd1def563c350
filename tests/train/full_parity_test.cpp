// Full fine-tune gradients vs transformers (tests/golden/lora/llama_mha/full_grads.safetensors,
// full_loss.json: every base weight's gradient of the token-mean CE on batch.json), CPU fp32,
// through the plain and the segmented backward; and segmented == full on random deep models.
#include <gtest/gtest.h>

#include <set>

#include "io/safetensors.h"
#include "train/loss.h"
#include "train/segmented.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace hearth::train;
using namespace hearth::train::testing;

namespace {

}  // namespace

TEST(FullFineTuneParity, GradsMatchTransformers) {
  auto model = hearth::models::load_model(golden("models/llama_mha"), {});
  auto params = full_parameters(*model, -1);
  LayerStack stack = make_layer_stack(*model, params);
  auto [ids, labels] = golden_batch(golden("lora/llama_mha/batch.json"));
  const double ref_loss = hearth::io::read_json(golden("lora/llama_mha/full_loss.json"))["loss"].get<double>();
  auto gold = hearth::io::SafetensorsFile::open(golden("lora/llama_mha/full_grads.safetensors"));
  std::set<std::string> names;
  for (const auto& p : params) names.insert(p.name);
  for (const auto& info : gold->tensors()) EXPECT_TRUE(names.count(info.name)) << "not trained: " << info.name;
  EXPECT_EQ(names.size(), gold->tensors().size());

  for (int64_t seg : {0, 1}) {
    zero(params);
    BackwardOptions o;
    o.segment_size = seg;
    o.loss_chunk = 5;
    BackwardResult r = backward(stack, ids, shift_labels(labels), o);
    const double loss = r.loss_sum / r.n_tokens;
    EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss) << "segment " << seg;
    double worst = 0;
    for (const auto& p : params) {
      ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
      const double e = rel_err(p.tensor.grad(), gold->tensor(p.name));
      EXPECT_LT(e, 1e-5) << p.name << " segment " << seg;
      worst = std::max(worst, e);
    }
    std::printf("[full parity] segment %lld: loss %.8f (ref %.8f), worst grad rel err %.3g\n",
                static_cast<long long>(seg), loss, ref_loss, worst);
  }
}

// Segmented == full backward for every parameter of a full fine-tune, on the tiny golden models
// (2 layers: segment sizes 1, 2) and a random 7-layer model (sizes 1, 2, 3, 7).
TEST(FullFineTuneParity, SegmentedEqualsFullOnModels) {
  struct Case {
    std::string name;
    std::unique_ptr<hearth::models::Model> model;
    std::vector<int64_t> sizes;
  };
  std::vector<Case> cases;
  for (const char* v : {"llama_mha", "llama_gqa_tied", "qwen3", "llama_bias"})
    cases.push_back({v, hearth::models::load_model(golden(std::string("models/") + v), {}), {1, 2}});
  cases.push_back({"random7", random_llama(7, 3), {1, 2, 3, 7}});
  for (auto& c : cases) {
    auto params = full_parameters(*c.model, -1);
    LayerStack stack = make_layer_stack(*c.model, params);
    at::manual_seed(11);
    at::Tensor ids = at::randint(0, std::min<int64_t>(c.model->vocab_size(), 90), {2, 12}, at::kLong);
    at::Tensor labels = ids.clone();
    labels.index_put_({0, at::indexing::Slice(0, 5)}, kIgnoreIndex);
    labels.index_put_({1, at::indexing::Slice(9, 12)}, kIgnoreIndex);
    at::Tensor targets = shift_labels(labels);
    zero(params);
    BackwardOptions o;
    BackwardResult ref = backward(stack, ids, targets, o);
    std::vector<at::Tensor> ref_grads;
    for (const auto& p : params) ref_grads.push_back(p.tensor.grad().clone());
    for (int64_t s : c.sizes) {
      zero(params);
      o.segment_size = s;
      BackwardResult r = backward(stack, ids, targets, o);
      EXPECT_NEAR(r.loss_sum, ref.loss_sum, 1e-6 * std::abs(ref.loss_sum)) << c.name << " segment " << s;
      double worst = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        const double e = rel_err(params[i].tensor.grad(), ref_grads[i]);
        EXPECT_LT(e, 1e-6) << c.name << " " << params[i].name << " segment " << s;
        worst = std::max(worst, e);
      }
      std::printf("[segmented full] %s segment %lld: worst rel err %.3g\n", c.name.c_str(), static_cast<long long>(s),
                  worst);
    }
    for (const auto& p : params) p.tensor.requires_grad_(false);
  }
}
