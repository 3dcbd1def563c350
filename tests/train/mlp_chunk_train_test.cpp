// The chunked MLP checkpoint and offloaded boundaries inside the real backward (CPU fp32): on a
// random 3-layer llama with LoRA on every projection, on the MLP projections only (the first
// segment's MLP input is then a constant, and its gradients reach .grad only through the
// checkpoint's inner backward), and with a full fine-tune of the last block, --segment-size 1 and
// the full backward with --mlp-chunk (uneven chunks, chunk == positions, chunk > positions) give the
// gradients of no chunking within fp32 round-off (a double count would be 2x, a lost one 0); offloading on
// top is bit-identical. Qwen3.5 and Gemma 4 tiny models likewise (in fp64).
#include <gtest/gtest.h>

#include "adapters/adapter.h"
#include "adapters/mount.h"
#include "nn/linear.h"
#include "train/loss.h"
#include "train/segmented.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace hearth::train;
using namespace hearth::train::testing;

namespace {

// fp32 round-off: the MLP's GEMMs over chunks round differently from one GEMM over all rows, and
// through attention the smallest gradients (q/k lora_B) move by up to ~1.1e-6 relative (measured);
// a double-counted or lost gradient is off by O(1). The MLP alone holds 1e-6 (nn/mlp_chunk_test.cpp).
constexpr double kChunkTrainTol = 3e-6;

std::vector<at::Tensor> mlp_chunk_grads(const std::vector<TrainableParam>& ps) {
  std::vector<at::Tensor> g;
  for (const auto& p : ps) g.push_back(p.tensor.grad().defined() ? p.tensor.grad().clone() : at::Tensor());
  return g;
}

// Gradients for every option set in `variants` against `ref` (segment 1, no chunking, kept).
void expect_chunked_grads_equal(hearth::models::Model& model, const std::vector<TrainableParam>& params,
                                const std::string& what, int64_t vocab) {
  LayerStack stack = make_layer_stack(model, params);
  at::manual_seed(3);
  at::Tensor ids = at::randint(2, vocab, {2, 23}, at::kLong);  // 46 positions
  at::Tensor labels = ids.clone();
  labels.index_put_({0, at::indexing::Slice(0, 5)}, kIgnoreIndex);
  const at::Tensor targets = shift_labels(labels);
  BackwardOptions base;
  base.segment_size = 1;
  base.isolate = model.isolated_layers();
  base.loss_chunk = 9;
  zero(params);
  const BackwardResult ref = backward(stack, ids, targets, base);
  const auto g_ref = mlp_chunk_grads(params);
  int defined = 0;
  for (const auto& g : g_ref) defined += g.defined();
  ASSERT_EQ(defined, static_cast<int>(params.size())) << what << ": every parameter has a gradient";
  struct Variant {
    int64_t segment, chunk;
    bool offload;
  };
  std::vector<at::Tensor> g_chunk5;
  for (const Variant& v : std::vector<Variant>{{1, 5, false}, {1, 5, true}, {1, 46, false}, {1, 100, true},
                                               {1, 1, false}, {0, 7, false}, {2, 5, true}}) {
    BackwardOptions o = base;
    o.segment_size = v.segment;
    o.mlp_chunk = v.chunk;
    o.offload_boundaries = v.offload;
    zero(params);
    const BackwardResult r = backward(stack, ids, targets, o);
    const std::string tag = what + " segment " + std::to_string(v.segment) + " chunk " + std::to_string(v.chunk) +
                            (v.offload ? " offloaded" : "");
    EXPECT_NEAR(r.loss_sum, ref.loss_sum, 1e-6 * std::abs(ref.loss_sum)) << tag;
    const auto g = mlp_chunk_grads(params);
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_TRUE(g[i].defined()) << tag << " " << params[i].name << " lost its gradient";
      EXPECT_LT(rel_err(g[i], g_ref[i]), kChunkTrainTol) << tag << " " << params[i].name;
    }
    if (v.segment == 1 && v.chunk == 5) {
      if (!v.offload) {
        g_chunk5 = g;
      } else {
        for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(at::equal(g[i], g_chunk5[i])) << tag << " " << params[i].name;
        EXPECT_GT(r.boundary_host_bytes, 0) << tag;
        EXPECT_LT(r.boundary_device_bytes, r.boundary_host_bytes) << tag;  // only those being brought back
        if (model.num_layers() == 3 && model.model_type() == "llama")
          EXPECT_EQ(r.boundary_device_bytes * 3, r.boundary_host_bytes) << tag;  // one of 3 edges at a time

      }
    }
  }
}

hearth::adapters::Adapter attach(hearth::models::Model& m, std::vector<std::string> keys) {
  hearth::adapters::LoraConfig lc;
  lc.rank = 4;
  lc.scale = 2.0;
  lc.keys = std::move(keys);
  return hearth::adapters::attach_trainable(m, lc, 7, "train");
}

}  // namespace

TEST(MlpChunkTraining, LlamaLoraEveryProjection) {
  auto model = random_llama(3, 21);
  auto adapter = attach(*model, {});
  hearth::nn::ActiveAdapters active({"train"});
  expect_chunked_grads_equal(*model, lora_params(adapter), "llama lora", 97);
}

// LoRA on gate/up/down only: in the first segment nothing before the MLP is trainable and its
// input boundary needs no gradient, so the MLP input is a constant.
TEST(MlpChunkTraining, LlamaLoraOnMlpOnlyWithConstantMlpInput) {
  auto model = random_llama(3, 22);
  auto adapter = attach(*model, {"gate_proj", "up_proj", "down_proj"});
  hearth::nn::ActiveAdapters active({"train"});
  expect_chunked_grads_equal(*model, lora_params(adapter), "llama mlp-only lora", 97);
}

TEST(MlpChunkTraining, LlamaFullFineTuneOfTheLastBlock) {
  auto model = random_llama(3, 23);
  expect_chunked_grads_equal(*model, full_parameters(*model, 1), "llama full (last block)", 97);
}

TEST(MlpChunkTraining, Qwen3_5AndGemma4Lora) {
  for (const char* v : {"qwen3_5/q35_untied_hv1_mqa", "gemma4_e"}) {
    // fp64: these models' large activations turn the chunks' fp32 round-off into ~1e-5 on the
    // smallest gradients; in double any real difference would still show.
    auto model = hearth::models::load_model(golden(std::string("models/") + v), {at::kCPU, at::kDouble});
    auto adapter = attach(*model, {});
    hearth::nn::ActiveAdapters active({"train"});
    expect_chunked_grads_equal(*model, lora_params(adapter), v, std::min<int64_t>(model->vocab_size(), 500));
  }
}
