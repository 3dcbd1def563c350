// Parity with transformers on the GPU (tier 2, CUDA bf16): runs only where HEARTH_CUDA_GOLDENS
// names a folder made by tools/gen_cuda_goldens.py on the same GPU right before (those references
// depend on the GPU and library versions, so they are not committed). For each model, Hearth's plain
// attention path is compared with transformers' eager run and Hearth's SDPA path with transformers'
// sdpa run: 100 greedy tokens through the KV cache must be identical; prompt and first decode-step
// logits are compared and their max |Δ| printed (0 = bit-identical). This tier runs with the fused
// decode kernels off (nn/fused_ops.h: their RMSNorm sums squares in another order) and SDPA free to
// take cuDNN as PyTorch's default does (compat::set_sdpa_cudnn_for_inference); a second pass with
// Hearth's defaults (fused kernels on, cuDNN out of inference) prints the same numbers, the price
// of the fast path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/torch_compat.h"
#include "io/hf_config.h"
#include "models/gemma4/gemma4.h"
#include "models/llama/llama.h"
#include "models/qwen3_5/qwen3_5.h"
#include "models/registry.h"
#include "nn/fused_ops.h"

namespace fs = std::filesystem;

namespace {

at::Tensor read_f32(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size() / 4)}, at::kFloat);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// Selects the attention path of the families that have two (llama, qwen3_5, gemma4); false for others.
bool set_backend(hearth::models::Model* model, hearth::nn::AttentionBackend backend) {
  if (auto* m = dynamic_cast<hearth::models::llama::LlamaModel*>(model)) m->set_attention_backend(backend);
  else if (auto* q = dynamic_cast<hearth::models::qwen3_5::Qwen3_5Model*>(model)) q->set_attention_backend(backend);
  else if (auto* g = dynamic_cast<hearth::models::gemma4::Gemma4Model*>(model)) g->set_attention_backend(backend);
  else return false;
  return true;
}

// `fused`: whether the fused decode kernels run; with them off the greedy tokens must be equal, with
// them on the numbers are printed and at least `min_agree` leading greedy tokens must be equal.
void check_model(const fs::path& gdir, const std::string& golden_file, hearth::nn::AttentionBackend backend,
                 bool fused = false, size_t min_agree = 0) {
  const bool was_fused = hearth::nn::set_fused_decode(fused);
  // The strict tier lets SDPA pick its backends as PyTorch does for transformers (cuDNN's included);
  // Hearth's default leaves cuDNN out of inference (torch_compat.h), which changes bits.
  const bool was_cudnn = hearth::compat::set_sdpa_cudnn_for_inference(!fused);
  struct Restore {
    bool on, cudnn;
    ~Restore() {
      hearth::nn::set_fused_decode(on);
      hearth::compat::set_sdpa_cudnn_for_inference(cudnn);
    }
  } restore{was_fused, was_cudnn};
  auto golden = hearth::io::read_json(gdir / golden_file);
  const fs::path model_dir = golden["model"].get<std::string>();
  auto model = hearth::models::load_model(model_dir, {at::kCUDA, at::kBFloat16});
  // llama, qwen3_5 and gemma4 take transformers' eager or SDPA op order (each compared with the
  // matching reference); other families run their one path against the eager reference only.
  if (!set_backend(model.get(), backend) && backend != hearth::nn::AttentionBackend::kPlain) return;
  for (const auto& p : golden["prompts"]) {
    auto ids = p["ids"].get<std::vector<int64_t>>();
    const int64_t T = static_cast<int64_t>(ids.size());
    auto caches = model->make_cache();
    at::Tensor logits = model->forward(at::tensor(ids, at::kLong).view({1, T}).to(at::kCUDA), 0, &caches)[0];
    at::Tensor want = read_f32(gdir / p["logits"].get<std::string>()).view({T, -1});
    const double prompt_diff = (logits.to(at::kFloat).cpu() - want).abs().max().item<double>();
    auto want_greedy = p["greedy_ids"].get<std::vector<int64_t>>();
    std::vector<int64_t> greedy;
    std::vector<double> step_diffs;
    at::Tensor last = logits[-1];
    for (size_t s = 0; s < want_greedy.size(); ++s) {
      const int64_t next = last.argmax().item<int64_t>();
      greedy.push_back(next);
      last = model->forward(at::full({1, 1}, next, at::TensorOptions().dtype(at::kLong).device(at::kCUDA)),
                            T + static_cast<int64_t>(s), &caches)[0][-1];
      if (s < p["step_logits"].size()) {
        at::Tensor w = read_f32(gdir / p["step_logits"][s].get<std::string>());
        step_diffs.push_back((last.to(at::kFloat).cpu() - w).abs().max().item<double>());
      }
    }
    size_t agree = 0;
    while (agree < greedy.size() && greedy[agree] == want_greedy[agree]) ++agree;
    std::cout << "[cuda-parity" << (fused ? " fused" : "") << "] " << model_dir.filename().string() << " "
              << golden_file << " T=" << T
              << " greedy agree " << agree << "/" << want_greedy.size() << " prompt max|dlogit|=" << prompt_diff;
    for (double d : step_diffs) std::cout << " step " << d;
    std::cout << "\n";
    if (!fused) EXPECT_EQ(greedy, want_greedy) << model_dir << " " << golden_file;
    else EXPECT_GE(agree, std::min(min_agree, want_greedy.size())) << model_dir << " " << golden_file << " (fused)";
  }
}

}  // namespace

TEST(CudaParity, GreedyAndLogitsMatchTransformersBf16) {
  const char* dir = std::getenv("HEARTH_CUDA_GOLDENS");
  if (!dir || !hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA and HEARTH_CUDA_GOLDENS (GPU machine)";
  for (const auto& e : fs::directory_iterator(dir)) {
    if (fs::exists(e.path() / "golden.json")) check_model(e.path(), "golden.json", hearth::nn::AttentionBackend::kPlain);
    if (hearth::compat::kHasSdpa && fs::exists(e.path() / "golden_sdpa.json"))
      check_model(e.path(), "golden_sdpa.json", hearth::nn::AttentionBackend::kSdpa);
  }
}

// The default path (fused decode kernels on) against the same references: one bf16 rounding apart
// in each RMSNorm, so logits are not bit-identical; the first 16 greedy tokens must still agree.
TEST(CudaParity, FusedKernelsStayWithinRoundingOfTransformersBf16) {
  const char* dir = std::getenv("HEARTH_CUDA_GOLDENS");
  if (!dir || !hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA and HEARTH_CUDA_GOLDENS (GPU machine)";
  for (const auto& e : fs::directory_iterator(dir)) {
    if (hearth::compat::kHasSdpa && fs::exists(e.path() / "golden_sdpa.json"))
      check_model(e.path(), "golden_sdpa.json", hearth::nn::AttentionBackend::kSdpa, /*fused=*/true, 16);
  }
}

// Diagnosis aid (GPU machine): where a family's bf16 forward departs from transformers'. Runs only
// where HEARTH_CUDA_LAYERS names a folder made by tools/cuda_layer_diff.py (dump), one subfolder per
// model with layers.json and transformers' hidden states h<i>.bin (float32 of the bf16 values; h0 =
// embeddings, h<i+1> = after layer i). Prints, per layer, max |Δ| of Hearth's own chain and of layer i
// alone fed transformers' input (isolated), so the first op that differs shows where it starts.
TEST(CudaParityLayers, PrintPerLayerDifferences) {
  const char* dir = std::getenv("HEARTH_CUDA_LAYERS");
  if (!dir || !hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA and HEARTH_CUDA_LAYERS (GPU machine)";
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!fs::exists(e.path() / "layers.json")) continue;
    auto meta = hearth::io::read_json(e.path() / "layers.json");
    auto model = hearth::models::load_model(meta["model"].get<std::string>(), {at::kCUDA, at::kBFloat16});
    set_backend(model.get(), hearth::nn::AttentionBackend::kPlain);  // the dump is transformers' eager run
    auto ids = meta["ids"].get<std::vector<int64_t>>();
    const int64_t T = static_cast<int64_t>(ids.size()), L = model->num_layers();
    auto tf = [&](int64_t i) {
      return read_f32(e.path() / hearth::cat("h", i, ".bin")).view({1, T, -1}).to(at::kCUDA).to(at::kBFloat16);
    };
    auto diff = [](const at::Tensor& a, const at::Tensor& b) {
      return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
    };
    const int64_t recorded = meta["num"].get<int64_t>();
    hearth::models::Boundary own = model->embed(at::tensor(ids, at::kLong).view({1, T}).to(at::kCUDA));
    std::cout << "[layers] " << e.path().filename().string() << " embed " << diff(own.hidden, tf(0)) << "\n";
    auto positions = hearth::models::Positions::uniform(0, 1);
    for (int64_t i = 0; i < L && i + 1 < recorded; ++i) {
      hearth::models::Boundary fed = own;
      fed.hidden = tf(i);
      at::Tensor iso = model->forward_layers(fed, i, i + 1, positions, nullptr).hidden;
      own = model->forward_layers(own, i, i + 1, positions, nullptr);
      std::cout << "[layers] " << e.path().filename().string() << " layer " << i << " chain "
                << diff(own.hidden, tf(i + 1)) << " isolated " << diff(iso, tf(i + 1)) << " |h| "
                << tf(i + 1).to(at::kFloat).abs().max().item<double>() << "\n";
    }
  }
}
