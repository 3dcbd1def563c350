// The lean training Functions (nn/lean_grad.h) inside the real backward, and what they save:
// - on a random 3-layer llama (CPU, fp32 and bf16), LoRA on every projection and a full fine-tune of
//   the last block (its norm weights train), segment 1 and the full backward: the loss is bit-identical
//   with the lean path on and off (its forward is the reference's), the gradients equal within fp32
//   round-off (bf16: within the dtype's rounding);
// - peak memory (a fresh child process per measurement, peak RSS above the RSS before, malloc's
//   mmap threshold fixed so RSS follows the live tensors) of a forward + backward of one bf16
//   RMSNorm (llama's; the fp32-weight norm of Qwen3.5 / Gemma 4; Qwen3.5's gated norm with 32 heads
//   of 128 per token), one RoPE and one bf16 llama layer (LoRA, chunked MLP), reference vs lean: lower with
//   the lean path. HEARTH_LEAN_MEM_T=<tokens> sets the sequence length of the norm and RoPE cases,
//   HEARTH_LEAN_MEM_LAYER_T the layer's (the defaults, 8192 and 2048, keep the test quick).
#include <gtest/gtest.h>

#include <unistd.h>

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "adapters/adapter.h"
#include "adapters/mount.h"
#include "models/qwen3_5/qwen3_5.h"
#include "nn/lean_grad.h"
#include "nn/linear.h"
#include "nn/mlp_chunk.h"
#include "nn/rms_norm.h"
#include "nn/rope.h"
#include "train/loss.h"
#include "train/segmented.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace hearth::train;
using namespace hearth::train::testing;

namespace {

struct LeanTrainSwitch {
  bool was;
  explicit LeanTrainSwitch(bool on) : was(hearth::nn::set_lean_grad(on)) {}
  ~LeanTrainSwitch() { hearth::nn::set_lean_grad(was); }
};

std::vector<at::Tensor> lean_train_grads(const std::vector<TrainableParam>& ps) {
  std::vector<at::Tensor> g;
  for (const auto& p : ps) g.push_back(p.tensor.grad().defined() ? p.tensor.grad().clone() : at::Tensor());
  return g;
}

void lean_train_compare(hearth::models::Model& model, const std::vector<TrainableParam>& params, double tol,
                        const std::string& what) {
  LayerStack stack = make_layer_stack(model, params);
  at::manual_seed(4);
  const at::Tensor ids = at::randint(2, 97, {2, 29}, at::kLong);
  const at::Tensor targets = shift_labels(ids);
  for (int64_t seg : {1, 0}) {
    BackwardOptions o;
    o.segment_size = seg;
    o.loss_chunk = 16;
    BackwardResult r[2];
    std::vector<at::Tensor> g[2];
    for (int lean = 0; lean < 2; ++lean) {
      LeanTrainSwitch sw(lean == 1);
      zero(params);
      r[lean] = backward(stack, ids, targets, o);
      g[lean] = lean_train_grads(params);
    }
    const std::string tag = what + " segment " + std::to_string(seg);
    EXPECT_EQ(r[1].loss_sum, r[0].loss_sum) << tag;  // bit-identical forward
    double worst = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(g[0][i].defined() && g[1][i].defined()) << tag << " " << params[i].name;
      ASSERT_GT(g[0][i].abs().sum().item<double>(), 0) << tag << " " << params[i].name;
      const double e = rel_err(g[1][i], g[0][i]);
      EXPECT_LT(e, tol) << tag << " " << params[i].name;
      worst = std::max(worst, e);
    }
    std::printf("[lean_grad] %s: loss %.9g both ways, largest gradient difference %.2e relative\n", tag.c_str(),
                r[0].loss_sum, worst);
  }
}

// Reads "<key>: N kB" from /proc/self/status, in bytes.
int64_t lean_mem_status(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::atoll(line.c_str() + k.size()) * 1024;
  return -1;
}

// A llama model for the memory case: C 4096, 2 heads (1 KV) of 64, intermediate 1024, bf16 —
// wide rows (where the norms' fp32 copies live), few heads (the CPU's eager attention is O(T²)) and
// a narrow MLP (a CPU without native bf16 matmuls, e.g. an AMD EPYC without AVX-512, took over 300 s
// for one pass of this layer at intermediate 4096 and T 2048).
std::unique_ptr<hearth::models::Model> lean_mem_model() {
  const int64_t C = 4096, H = 2, Hkv = 1, D = 64, I = 1024, V = 97;
  nlohmann::json cfg = {{"model_type", "llama"}, {"vocab_size", V}, {"hidden_size", C},
                        {"intermediate_size", I}, {"num_hidden_layers", 1}, {"num_attention_heads", H},
                        {"num_key_value_heads", Hkv}, {"head_dim", D}, {"rms_norm_eps", 1e-5},
                        {"max_position_embeddings", 1 << 20}, {"rope_theta", 500000.0}};
  at::manual_seed(9);
  std::map<std::string, at::Tensor> w;
  auto rnd = [](std::vector<int64_t> shape, double s) { return (at::randn(shape) * s).to(at::kBFloat16); };
  w["model.embed_tokens.weight"] = rnd({V, C}, 0.5);
  const std::string p = "model.layers.0.";
  w[p + "input_layernorm.weight"] = rnd({C}, 0.1) + 1;
  w[p + "post_attention_layernorm.weight"] = rnd({C}, 0.1) + 1;
  w[p + "self_attn.q_proj.weight"] = rnd({H * D, C}, 0.02);
  w[p + "self_attn.k_proj.weight"] = rnd({Hkv * D, C}, 0.02);
  w[p + "self_attn.v_proj.weight"] = rnd({Hkv * D, C}, 0.02);
  w[p + "self_attn.o_proj.weight"] = rnd({C, H * D}, 0.02);
  w[p + "mlp.gate_proj.weight"] = rnd({I, C}, 0.02);
  w[p + "mlp.up_proj.weight"] = rnd({I, C}, 0.02);
  w[p + "mlp.down_proj.weight"] = rnd({C, I}, 0.02);
  w["model.norm.weight"] = rnd({C}, 0.1) + 1;
  w["lm_head.weight"] = rnd({V, C}, 0.02);
  hearth::nn::TensorMapSource src(std::move(w), "lean_mem_model");
  return hearth::models::build_model(
      hearth::models::BuildArgs{cfg, "lean_mem_model", src, std::nullopt, {at::kCPU, at::kBFloat16}});
}

// Peak bytes above the resting RSS of case `name` (norm | rope | layer) at T tokens in a child
// process, lean on or off; -1 if the child failed.
int64_t lean_mem_measure(const std::string& name, bool lean, int64_t T) {
  const std::string cmd = "MALLOC_MMAP_THRESHOLD_=131072 HEARTH_LEAN_GRAD=" + std::string(lean ? "1" : "0") +
                          " HEARTH_LEAN_MEM_CASE=" + name + " HEARTH_LEAN_MEM_CHILD_T=" + std::to_string(T) +
                          " /proc/" + std::to_string(getpid()) + "/exe --gtest_filter=LeanGradMemory.CpuChild 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  char line[512];
  long peak = -1;
  while (f && fgets(line, sizeof line, f))
    if (std::sscanf(line, "LEAN_PEAK %ld", &peak) == 1) break;
  if (f) pclose(f);
  return peak;
}

}  // namespace

TEST(LeanGradTraining, LlamaGradientsUnchangedFp32AndBf16) {
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const std::string name = dt == at::kFloat ? "fp32" : "bf16";
    // fp32: the norms' backward sums in another order (~1e-7 relative per op); bf16: every
    // gradient op rounds to 8 bits, and a flipped rounding moves what follows by ~2^-8.
    const double tol = dt == at::kFloat ? 2e-6 : 2e-2;
    {
      auto model = random_llama(3, 31, {at::kCPU, dt});
      hearth::adapters::LoraConfig lc;
      lc.rank = 4;
      lc.scale = 2.0;
      auto adapter = hearth::adapters::attach_trainable(*model, lc, 7, "train");
      {
        c10::NoGradGuard no_grad;  // B starts at zero (A's gradient too): give every tensor a gradient
        for (auto& [path, ad] : adapter.modules) ad.b.normal_(0.0, 0.2);
      }
      hearth::nn::ActiveAdapters active({"train"});
      lean_train_compare(*model, lora_params(adapter), tol, name + " lora");
    }
    {
      auto model = random_llama(3, 32, {at::kCPU, dt});
      lean_train_compare(*model, full_parameters(*model, 1), tol, name + " full (last block)");
    }
  }
}

TEST(LeanGradMemory, CpuChild) {
  const char* which = std::getenv("HEARTH_LEAN_MEM_CASE");
  if (!which) GTEST_SKIP() << "run by LeanGradMemory.PeakFalls in a child process";
  const std::string name = which;
  const int64_t T = std::atoll(std::getenv("HEARTH_LEAN_MEM_CHILD_T"));
  at::manual_seed(1);
  std::function<void()> run;
  at::Tensor x, w, g, cos, sin;
  std::unique_ptr<hearth::models::Model> model;
  hearth::adapters::Adapter adapter;
  LayerStack stack;
  std::optional<hearth::nn::ActiveAdapters> active;
  if (name == "norm") {  // one RMSNorm of the 8B shape's rows: [T, 4096] bf16
    x = at::randn({1, T, 4096}).to(at::kBFloat16).requires_grad_(true);
    w = (1 + 0.1 * at::randn({4096})).to(at::kBFloat16);
    g = at::randn({1, T, 4096}).to(at::kBFloat16);
    run = [&] { hearth::nn::RMSNorm(w, 1e-5).forward(x).backward(g); };
  } else if (name == "norm_fp32w") {  // Gemma4RMSNorm / Qwen3_5RMSNorm on [T, 4096] bf16 rows
    x = at::randn({1, T, 4096}).to(at::kBFloat16).requires_grad_(true);
    w = (0.1 * at::randn({4096})).to(at::kBFloat16);
    g = at::randn({1, T, 4096}).to(at::kBFloat16);
    run = [&] { hearth::models::qwen3_5::ZeroCenteredRMSNorm{w, 1e-6, 1.0}.forward(x).backward(g); };
  } else if (name == "norm_gated") {  // Qwen3_5RMSNormGated: 32 value heads of 128 per token, bf16
    x = at::randn({T * 32, 128}).to(at::kBFloat16).requires_grad_(true);
    cos = at::randn({T * 32, 128}).to(at::kBFloat16).requires_grad_(true);  // the gate
    w = (1 + 0.1 * at::randn({128})).to(at::kBFloat16);
    g = at::randn({T * 32, 128}).to(at::kBFloat16);
    run = [&] { hearth::models::qwen3_5::RMSNormGated{w, 1e-6}.forward(x, cos).backward(g); };
  } else if (name == "rope") {  // RoPE on q of the 8B shape: 32 heads of 128, bf16, strided as projected
    x = at::randn({1, T, 32, 128}).to(at::kBFloat16).transpose(1, 2).requires_grad_(true);
    hearth::nn::RotaryEmbedding rope(hearth::nn::RopeParams{}, 128, T, at::kCPU);
    std::tie(cos, sin) = rope.cos_sin(0, T, at::kBFloat16);
    g = at::randn({1, 32, T, 128}).to(at::kBFloat16);
    run = [&] { hearth::nn::apply_rotary(x, cos, sin).backward(g); };
  } else {  // one llama layer with LoRA on every projection and the MLP chunked as --mlp-chunk 1024
    model = lean_mem_model();
    hearth::adapters::LoraConfig lc;
    lc.rank = 8;
    adapter = hearth::adapters::attach_trainable(*model, lc, 7, "train");
    active.emplace(std::vector<std::string>{"train"});
    stack = make_layer_stack(*model, lora_params(adapter));
    x = (at::randn({1, T, 4096}) * 0.5).to(at::kBFloat16).requires_grad_(true);
    g = at::randn({1, T, 4096}).to(at::kBFloat16);
    run = [&] {
      hearth::nn::MlpChunkScope chunk(1024);
      stack.layers(hearth::models::Boundary(x), 0, 1).hidden.backward(g);
    };
  }
  { std::ofstream("/proc/self/clear_refs") << "5"; }  // VmHWM := VmRSS
  const int64_t rest = lean_mem_status("VmRSS");
  run();
  std::printf("LEAN_PEAK %ld\n", static_cast<long>(lean_mem_status("VmHWM") - rest));
}

TEST(LeanGradMemory, PeakFalls) {
  const char* t_env = std::getenv("HEARTH_LEAN_MEM_T");
  const char* layer_t_env = std::getenv("HEARTH_LEAN_MEM_LAYER_T");
  for (const std::string name : {"norm", "norm_fp32w", "norm_gated", "rope", "layer"}) {
    const char* env = name == "layer" ? layer_t_env : t_env;
    const int64_t T = env ? std::atoll(env) : (name == "layer" ? 2048 : 8192);
    const int64_t ref = lean_mem_measure(name, false, T), lean = lean_mem_measure(name, true, T);
    std::printf("[lean_grad] %s T %lld forward+backward peak above resting: reference %.1f MB, lean %.1f MB\n",
                name.c_str(), static_cast<long long>(T), ref / 1e6, lean / 1e6);
    ASSERT_GT(ref, 0) << name;
    ASSERT_GT(lean, 0) << name;
    // the norms, rope: the fp32 copies and the temporaries (several times the bf16 input) gone.
    if (name != "layer") EXPECT_LT(lean, ref * 3 / 4) << name;
    else EXPECT_LT(lean, ref) << name;
  }
}
