// LoRA on the Qwen3.5 hybrid (CPU fp32): adapters attach to every projection of both layer kinds
// through linear_modules, and the segmented backward (--segment-size 1 and 2, and with the
// full-attention layers isolated) gives the full backward's gradients within 1e-6 relative.
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

TEST(Qwen3_5Lora, SegmentedEqualsFull) {
  for (const char* v : {"q35_tied_hv2", "q35_untied_hv1_mqa"}) {
    auto model = hearth::models::load_model(golden(std::string("models/qwen3_5/") + v), {});
    hearth::adapters::LoraConfig lc;
    lc.rank = 4;
    lc.scale = 2.0;
    lc.keys = {"q_proj",    "k_proj",    "v_proj",    "o_proj",   "in_proj_qkv", "in_proj_z",
               "in_proj_b", "in_proj_a", "out_proj", "gate_proj", "up_proj",     "down_proj"};
    auto adapter = hearth::adapters::attach_trainable(*model, lc, 1, "train");
    // 4 per full layer, 5 per linear layer, 3 MLP per layer.
    const int64_t full = static_cast<int64_t>(model->isolated_layers().size());
    const int64_t want = full * 4 + (model->num_layers() - full) * 5 + model->num_layers() * 3;
    EXPECT_EQ(static_cast<int64_t>(adapter.modules.size()), want) << v;
    {
      c10::NoGradGuard ng;  // B = 0 at init would make every A gradient zero: randomize B
      for (auto& [path, ad] : adapter.modules) ad.b.normal_(0, 0.1);
    }
    hearth::nn::ActiveAdapters active({"train"});
    std::vector<TrainableParam> params;
    for (const auto& [path, ad] : adapter.modules) {
      const int64_t layer = hearth::adapters::layer_index(path);
      params.push_back({path + ".lora_A", ad.a, layer, false, layer < 0});
      params.push_back({path + ".lora_B", ad.b, layer, false, layer < 0});
    }
    auto zero = [&] {
      for (auto& p : params) p.tensor.mutable_grad() = at::Tensor();
    };
    LayerStack stack = make_layer_stack(*model, params);
    at::manual_seed(2);
    at::Tensor ids = at::randint(2, 500, {2, 75}, at::kLong);  // > 64 tokens: two chunks
    at::Tensor labels = ids.clone();
    labels.index_put_({0, at::indexing::Slice(0, 9)}, kIgnoreIndex);
    at::Tensor targets = shift_labels(labels);
    zero();
    BackwardOptions o;
    backward(stack, ids, targets, o);
    std::vector<at::Tensor> ref;
    for (const auto& p : params) {
      ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
      EXPECT_GT(p.tensor.grad().abs().max().item<double>(), 0.0) << p.name;
      ref.push_back(p.tensor.grad().clone());
    }
    for (auto [seg, isolate] : std::vector<std::pair<int64_t, bool>>{{1, false}, {2, false}, {2, true}}) {
      zero();
      o.segment_size = seg;
      o.isolate = isolate ? model->isolated_layers() : std::vector<int64_t>{};
      backward(stack, ids, targets, o);
      double worst = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        const double e = rel_err(params[i].tensor.grad(), ref[i]);
        EXPECT_LT(e, 1e-6) << v << " " << params[i].name << " segment " << seg;
        worst = std::max(worst, e);
      }
      std::printf("[qwen3_5 lora] %s segment %lld%s: worst rel err %.3g\n", v, static_cast<long long>(seg),
                  isolate ? " (full layers isolated)" : "", worst);
    }
  }
}

// LoRA gradients vs transformers + PEFT (tests/golden/lora/qwen3_5/<variant>, made by
// tools/gen_qwen3_5_lora_goldens.py): loss within 1e-5 relative and every lora_A / lora_B gradient
// within 5e-4 relative (not the 1e-5 of the llama family: measured worst 1.1e-4, the fp32 rounding
// spread of the chunked gated delta rule on these random models — see qwen3_5_parity_test.cpp),
// plain and segmented.
TEST(Qwen3_5Lora, GradsMatchPeft) {
  for (const char* v : {"q35_tied_hv2", "q35_untied_hv1_mqa"}) {
    const auto dir = golden(std::string("lora/qwen3_5/") + v);
    if (!std::filesystem::exists(dir / "grads.safetensors")) GTEST_SKIP() << "no golden " << dir;
    auto model = hearth::models::load_model(golden(std::string("models/qwen3_5/") + v), {});
    auto gold = hearth::adapters::load_adapter(dir);
    hearth::adapters::LoraConfig lc;
    lc.rank = 4;
    lc.scale = 8.0 / 4.0;
    lc.keys = {"q_proj",    "k_proj",    "v_proj",    "o_proj",   "in_proj_qkv", "in_proj_z",
               "in_proj_b", "in_proj_a", "out_proj", "gate_proj", "up_proj",     "down_proj"};
    auto adapter = hearth::adapters::attach_trainable(*model, lc, 0, "train");
    ASSERT_EQ(adapter.modules.size(), gold.modules.size()) << v;
    {
      c10::NoGradGuard ng;
      for (auto& [path, ad] : adapter.modules) {
        const auto& g = gold.modules.at(path);
        ad.a.copy_(g.a);
        ad.b.copy_(g.b);
      }
    }
    hearth::nn::ActiveAdapters active({"train"});
    std::vector<TrainableParam> params;
    for (const auto& [path, ad] : adapter.modules) {
      const int64_t layer = hearth::adapters::layer_index(path);
      params.push_back({path + ".lora_A", ad.a, layer, false, layer < 0});
      params.push_back({path + ".lora_B", ad.b, layer, false, layer < 0});
    }
    LayerStack stack = make_layer_stack(*model, params);
    auto [ids, labels] = golden_batch(dir / "batch.json");
    const double ref_loss = hearth::io::read_json(dir / "batch.json")["loss"].get<double>();
    auto grads = hearth::io::SafetensorsFile::open(dir / "grads.safetensors");
    for (int64_t seg : {0, 1}) {
      for (auto& p : params) p.tensor.mutable_grad() = at::Tensor();
      BackwardOptions o;
      o.segment_size = seg;
      BackwardResult r = backward(stack, ids, shift_labels(labels), o);
      const double loss = r.loss_sum / r.n_tokens;
      EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss) << v << " segment " << seg;
      double worst = 0;
      for (const auto& p : params) {
        const std::string suffix = p.name.substr(p.name.size() - 6);
        const std::string module = p.name.substr(0, p.name.size() - 7);
        const std::string peft = "base_model.model." + module + "." + suffix + ".default.weight";
        ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
        const double e = rel_err(p.tensor.grad(), grads->tensor(peft));
        EXPECT_LT(e, 5e-4) << v << " " << p.name << " segment " << seg;
        worst = std::max(worst, e);
      }
      std::printf("[qwen3_5 lora parity] %s segment %lld: loss %.8f (PEFT %.8f), worst grad rel err %.3g\n", v,
                  static_cast<long long>(seg), loss, ref_loss, worst);
    }
  }
}
