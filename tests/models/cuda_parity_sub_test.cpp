// Diagnosis aid for CUDA bf16 parity (GPU machine): feeds each submodule of chosen Qwen3.5 / Gemma 4
// decoder layers transformers' own recorded input and prints max |Δ| of Hearth's output against
// transformers' (0 = bit-identical), so the first op that departs shows. Runs only where
// HEARTH_CUDA_SUB names a folder made by tools/cuda_sub_dump.py on the same GPU (meta.json +
// <key>.bin). A diagnosis printout, not a parity assertion: CudaParity.* in cuda_parity_test.cpp is.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/torch_compat.h"
#include "io/hf_config.h"
#include "models/gemma4/gemma4.h"
#include "models/qwen3_5/qwen3_5.h"
#include "models/registry.h"
#include "nn/attention.h"
#include "nn/rope.h"

namespace fs = std::filesystem;

namespace {

struct Dump {
  fs::path dir;
  nlohmann::json meta;
  bool has(const std::string& key) const { return meta["tensors"].contains(key); }
  at::Tensor get(const std::string& key) const {
    std::ifstream f(dir / (key + ".bin"), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
    at::Tensor t = at::empty({static_cast<int64_t>(bytes.size() / 4)}, at::kFloat);
    std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    std::vector<int64_t> shape = meta["tensors"][key].get<std::vector<int64_t>>();
    return t.view(shape).to(at::kCUDA).to(at::kBFloat16);
  }
};

void report(const std::string& who, const std::string& what, const at::Tensor& mine, const at::Tensor& want) {
  if (mine.numel() != want.numel()) {
    std::cout << "[sub] " << who << " " << what << " SHAPE " << mine.sizes() << " vs " << want.sizes() << "\n";
    return;
  }
  at::Tensor a = mine.to(at::kFloat).reshape(want.sizes()), b = want.to(at::kFloat);
  at::Tensor d = (a - b).abs();
  std::cout << "[sub] " << who << " " << what << " max|d| " << d.max().item<double>() << " ndiff "
            << (a != b).sum().item<int64_t>() << "/" << a.numel() << " |ref| " << b.abs().max().item<double>()
            << " dtype " << c10::toString(mine.scalar_type()) << "\n";
}

using Fn = std::function<at::Tensor(const at::Tensor&)>;

void run_table(const Dump& d, const std::string& who, int64_t li, const std::vector<std::pair<std::string, Fn>>& table) {
  for (const auto& [name, fn] : table) {
    const std::string key = hearth::cat("L", li, name.empty() ? "" : ".", name);
    if (!d.has(key + ".in") || !d.has(key + ".out")) continue;
    report(who, key, fn(d.get(key + ".in")), d.get(key + ".out"));
  }
}

// The eager attention core fed transformers' q/k/v, and RoPE applied to transformers' normed q.
void check_attention_core(const Dump& d, const std::string& who, int64_t li, double scale,
                          std::optional<int64_t> window, const std::string& qnorm_key, bool bthd) {
  const std::string p = hearth::cat("L", li, ".attn_fn.");
  if (!d.has(p + "q")) return;
  at::Tensor q = d.get(p + "q"), k = d.get(p + "k"), v = d.get(p + "v");
  hearth::nn::AttentionParams ap;
  ap.scale = scale;
  ap.sliding_window = window;
  ap.backend = hearth::nn::AttentionBackend::kPlain;
  report(who, p + "out(plain)", hearth::nn::attention(q, k, v, ap).transpose(1, 2), d.get(p + "out"));
  ap.backend = hearth::nn::AttentionBackend::kSdpa;
  if (hearth::compat::kHasSdpa)
    report(who, p + "out(sdpa)", hearth::nn::attention(q, k, v, ap).transpose(1, 2), d.get(p + "out"));
  if (d.has(p + "mask")) {
    at::Tensor m = hearth::nn::attention_mask(q.size(2), k.size(2), ap, at::kBFloat16, q.device());
    at::Tensor want = d.get(p + "mask").squeeze(0).squeeze(0);
    std::cout << "[sub] " << who << " " << p << "mask equal " << (m.defined() ? at::equal(m, want) : false) << "\n";
  }
  const std::string cs = hearth::cat("L", li, ".");
  if (d.has(cs + "cos") && d.has(qnorm_key)) {
    at::Tensor qn = d.get(qnorm_key);  // [B, T, H, D]
    at::Tensor cos = d.get(cs + "cos")[0], sin = d.get(cs + "sin")[0];
    report(who, cs + "rope(q, tf cos)", hearth::nn::apply_rotary(qn.transpose(1, 2), cos, sin), q);
    (void)bthd;
  }
}

void check_qwen(hearth::models::qwen3_5::Qwen3_5Model& m, const Dump& d, const std::string& who) {
  const auto& c = m.config();
  const int64_t T = static_cast<int64_t>(d.meta["ids"].size());
  hearth::nn::RotaryEmbedding rot(c.rope, c.head_dim, c.max_position_embeddings, at::kCUDA);
  m.set_attention_backend(hearth::nn::AttentionBackend::kPlain);
  const auto tables = rot.cos_sin(0, T, at::kBFloat16);
  const at::Tensor cos = tables.first, sin = tables.second;
  for (int64_t li : d.meta["layers"].get<std::vector<int64_t>>()) {
    auto& L = m.layers()[li];
    std::vector<std::pair<std::string, Fn>> table = {
        {"input_layernorm", [&](const at::Tensor& x) { return L.input_layernorm.forward(x); }},
        {"post_attention_layernorm", [&](const at::Tensor& x) { return L.post_attention_layernorm.forward(x); }},
        {"mlp", [&](const at::Tensor& x) { return L.mlp.forward(x); }},
        {"mlp.gate_proj", [&](const at::Tensor& x) { return L.mlp.gate_proj.forward(x); }},
        {"mlp.up_proj", [&](const at::Tensor& x) { return L.mlp.up_proj.forward(x); }},
        {"mlp.down_proj", [&](const at::Tensor& x) { return L.mlp.down_proj.forward(x); }},
    };
    if (L.self_attn) {
      auto& a = *L.self_attn;
      table.push_back({"self_attn.q_proj", [&](const at::Tensor& x) { return a.q_proj.forward(x); }});
      table.push_back({"self_attn.k_proj", [&](const at::Tensor& x) { return a.k_proj.forward(x); }});
      table.push_back({"self_attn.v_proj", [&](const at::Tensor& x) { return a.v_proj.forward(x); }});
      table.push_back({"self_attn.o_proj", [&](const at::Tensor& x) { return a.o_proj.forward(x); }});
      table.push_back({"self_attn.q_norm", [&](const at::Tensor& x) { return a.q_norm.forward(x); }});
      table.push_back({"self_attn.k_norm", [&](const at::Tensor& x) { return a.k_norm.forward(x); }});
      table.push_back({"self_attn", [&](const at::Tensor& x) { return a.forward(x, cos, sin, 0, nullptr); }});
      const std::string cs = hearth::cat("L", li, ".");
      if (d.has(cs + "cos")) {
        report(who, cs + "cos", cos, d.get(cs + "cos")[0]);
        report(who, cs + "sin", sin, d.get(cs + "sin")[0]);
      }
      check_attention_core(d, who, li, a.scaling, std::nullopt, cs + "self_attn.q_norm.out", false);
    }
    table.push_back({"", [&](const at::Tensor& x) {
                       return m.forward_layers(hearth::models::Boundary(x), li, li + 1,
                                               hearth::models::Positions::uniform(0, 1), nullptr)
                           .hidden;
                     }});
    run_table(d, who, li, table);
  }
}

void check_gemma(hearth::models::gemma4::Gemma4Model& m, const Dump& d, const std::string& who,
                 const at::Tensor& ids) {
  const auto& c = m.config();
  const int64_t T = ids.size(1);
  m.set_attention_backend(hearth::nn::AttentionBackend::kPlain);
  hearth::models::Boundary emb = m.embed(ids);
  for (int64_t li : d.meta["layers"].get<std::vector<int64_t>>()) {
    auto& L = m.layers()[li];
    auto& a = L.self_attn;
    const bool sliding = c.sliding[li];
    const auto tables = m.rotary(sliding).cos_sin(0, T, at::kBFloat16);
    const at::Tensor cos = tables.first, sin = tables.second;
    const std::string cs = hearth::cat("L", li, ".");
    if (d.has(cs + "cos")) {
      report(who, cs + "cos", cos, d.get(cs + "cos")[0]);
      report(who, cs + "sin", sin, d.get(cs + "sin")[0]);
    }
    at::Tensor pli_tf;
    if (d.has(cs + "per_layer_input")) {
      pli_tf = d.get(cs + "per_layer_input");
      const at::Tensor* mine = emb.find("per_layer_inputs");
      if (mine) report(who, cs + "per_layer_input(embed)", mine->select(2, li), pli_tf);
    }
    auto gelu = [](const at::Tensor& x) { return at::gelu(x, "tanh"); };
    std::vector<std::pair<std::string, Fn>> table = {
        {"input_layernorm", [&](const at::Tensor& x) { return L.input_layernorm.forward(x); }},
        {"post_attention_layernorm", [&](const at::Tensor& x) { return L.post_attention_layernorm.forward(x); }},
        {"pre_feedforward_layernorm", [&](const at::Tensor& x) { return L.pre_feedforward_layernorm.forward(x); }},
        {"post_feedforward_layernorm", [&](const at::Tensor& x) { return L.post_feedforward_layernorm.forward(x); }},
        {"post_per_layer_input_norm", [&](const at::Tensor& x) { return L.post_per_layer_input_norm.forward(x); }},
        {"per_layer_input_gate", [&](const at::Tensor& x) { return L.per_layer_input_gate.forward(x); }},
        {"per_layer_projection", [&](const at::Tensor& x) { return L.per_layer_projection.forward(x); }},
        {"act_fn", gelu},
        {"mlp.act_fn", gelu},
        {"mlp", [&](const at::Tensor& x) { return L.mlp.forward(x); }},
        {"mlp.gate_proj", [&](const at::Tensor& x) { return L.mlp.gate_proj.forward(x); }},
        {"mlp.up_proj", [&](const at::Tensor& x) { return L.mlp.up_proj.forward(x); }},
        {"mlp.down_proj", [&](const at::Tensor& x) { return L.mlp.down_proj.forward(x); }},
        {"self_attn.q_proj", [&](const at::Tensor& x) { return a.q_proj.forward(x); }},
        {"self_attn.k_proj", [&](const at::Tensor& x) { return a.k_proj.forward(x); }},
        {"self_attn.v_proj", [&](const at::Tensor& x) { return a.v_proj.forward(x); }},
        {"self_attn.o_proj", [&](const at::Tensor& x) { return a.o_proj.forward(x); }},
        {"self_attn.q_norm", [&](const at::Tensor& x) { return a.q_norm.forward(x); }},
        {"self_attn.k_norm", [&](const at::Tensor& x) { return a.k_norm.forward(x); }},
        {"self_attn.v_norm", [&](const at::Tensor& x) { return a.v_norm.forward(x); }},
        {"self_attn", [&](const at::Tensor& x) { return a.forward(x, cos, sin, 0, nullptr, nullptr, nullptr); }},
        {"", [&](const at::Tensor& x) {
           return L.forward(x, pli_tf, cos, sin, 0, nullptr, nullptr, nullptr);
         }},
    };
    check_attention_core(d, who, li, 1.0, a.sliding_window, cs + "self_attn.q_norm.out", true);
    run_table(d, who, li, table);
    if (L.layer_scalar) std::cout << "[sub] " << who << " L" << li << " layer_scalar " << L.layer_scalar->item<double>()
                                  << " dtype " << c10::toString(L.layer_scalar->scalar_type()) << "\n";
  }
}

}  // namespace

TEST(CudaParitySub, PrintSubmoduleDifferences) {
  const char* dir = std::getenv("HEARTH_CUDA_SUB");
  if (!dir || !hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA and HEARTH_CUDA_SUB (GPU machine)";
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!fs::exists(e.path() / "meta.json")) continue;
    Dump d{e.path(), hearth::io::read_json(e.path() / "meta.json")};
    const std::string who = e.path().filename().string();
    auto model = hearth::models::load_model(d.meta["model"].get<std::string>(), {at::kCUDA, at::kBFloat16});
    auto idv = d.meta["ids"].get<std::vector<int64_t>>();
    at::Tensor ids = at::tensor(idv, at::kLong).view({1, -1}).to(at::kCUDA);
    if (d.has("embed.out")) report(who, "embed", model->embed(ids).hidden, d.get("embed.out"));
    if (d.has("norm.in") && d.has("logits")) report(who, "head(tf norm input)", model->head(d.get("norm.in")), d.get("logits"));
    if (auto* q = dynamic_cast<hearth::models::qwen3_5::Qwen3_5Model*>(model.get())) check_qwen(*q, d, who);
    if (auto* g = dynamic_cast<hearth::models::gemma4::Gemma4Model*>(model.get())) check_gemma(*g, d, who, ids);
  }
}
