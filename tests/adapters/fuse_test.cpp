// Fusing adapters into model folders: a fused dense model reproduces base + mounted adapter, a
// quantized model is requantized with its own spec (or dequantized), the output folder is complete
// and never half-written; the `hearth fuse` and `hearth generate --adapter-path` verbs end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "adapters/fuse.h"
#include "io/weights.h"
#include "lora_test_util.h"
#include "nn/quant.h"

namespace {
namespace fs = std::filesystem;
using namespace hearth;
using namespace hearth::testing;

at::Tensor lora_logits(models::Model& m, const adapters::Adapter& ad, const at::Tensor& ids) {
  adapters::mount(m, ad);
  nn::ActiveAdapters scope({ad.id});
  at::Tensor out = logits_of(m, ids);
  adapters::unmount(m, ad.id);
  return out;
}

TEST(Fuse, DenseFusedModelEqualsMountedAdapter) {
  TempDir tmp;
  const auto ad = adapters::load_adapter(golden_lora("llama_bias"));
  const auto ids = golden_batch("llama_bias").ids;
  auto base = load_tiny("llama_bias");
  const at::Tensor expected = lora_logits(*base, ad, ids);
  adapters::fuse_model(golden_model("llama_bias"), ad, tmp / "fused");
  auto fused = models::load_model(tmp / "fused", {at::kCPU, at::kFloat});
  // W + s·B·A rounded once against x·W + s·(x·A)·B: fp32 roundings apart, which the GEMM's own
  // blocking moves (1.12e-5 with PyTorch 2.11's CPU kernels, 8e-6 with 1.13, on logits of up to 6.2):
  // within 4e-6 of the logits' largest magnitude (base vs adapter: > 1e-2, checked below).
  const double diff = max_abs_diff(logits_of(*fused, ids), expected);
  EXPECT_LT(diff, 4e-6 * std::max(1.0, expected.abs().max().item<double>()));
  std::cout << "[ info ] fused dense vs mounted: max |logits diff| " << diff << " (largest |logit| "
            << expected.abs().max().item<double>() << ")\n";
  EXPECT_GT(max_abs_diff(logits_of(*base, ids), expected), 1e-2);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    EXPECT_TRUE(fs::exists(tmp / "fused" / f)) << f;
  // Untargeted tensors are copied bit for bit.
  auto in = io::WeightStore::open(golden_model("llama_bias"));
  auto out = io::WeightStore::open(tmp / "fused");
  EXPECT_EQ(in.names(), out.names());
  EXPECT_TRUE(at::equal(in.get("model.embed_tokens.weight"), out.get("model.embed_tokens.weight")));
  EXPECT_TRUE(at::equal(in.get("model.layers.0.self_attn.q_proj.bias"), out.get("model.layers.0.self_attn.q_proj.bias")));
  // An existing output folder is refused; no temp folder is left behind.
  EXPECT_THROW(adapters::fuse_model(golden_model("llama_bias"), ad, tmp / "fused"), Error);
  for (const auto& e : fs::directory_iterator(tmp.path())) EXPECT_EQ(e.path().filename().string(), "fused");
}

TEST(Fuse, TiedHeadAndMissingModulesAreErrors) {
  TempDir tmp;
  auto ad = adapters::load_adapter(golden_lora("llama_gqa_tied"));
  auto head = ad;
  head.modules["lm_head"] = nn::LoraAdapter{at::zeros({4, 64}), at::zeros({512, 4}), 1.0};
  try {
    adapters::fuse_model(golden_model("llama_gqa_tied"), head, tmp / "o");
    ADD_FAILURE() << "fused a tied lm_head";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tied"), std::string::npos) << e.what();
  }
  auto bad = ad;
  bad.modules["model.layers.5.mlp.up_proj"] = ad.modules.begin()->second;
  EXPECT_THROW(adapters::fuse_model(golden_model("llama_gqa_tied"), bad, tmp / "o"), Error);
  auto shape = ad;
  shape.modules.begin()->second.a = at::zeros({4, 65});
  EXPECT_THROW(adapters::fuse_model(golden_model("llama_gqa_tied"), shape, tmp / "o"), Error);
  EXPECT_FALSE(fs::exists(tmp / "o"));
}

TEST(Fuse, QuantizedModelRequantizedOrDequantized) {
  TempDir tmp;
  const fs::path q = tmp / "q4";
  auto r = run_hearth("convert --model '" + golden_model("llama_mha").string() + "' --out '" + q.string() +
                      "' -q --q-bits 4 --q-group-size 32");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto ad = adapters::load_adapter(golden_lora("llama_mha"));
  const auto ids = golden_batch("llama_mha").ids;
  auto qbase = models::load_model(q, {at::kCPU, at::kFloat});
  const at::Tensor base_logits = logits_of(*qbase, ids);
  const at::Tensor expected = lora_logits(*qbase, ad, ids);

  // --dequantize: dense weights; the result equals the quantized base + mounted adapter.
  adapters::FuseOptions dq;
  dq.dequantize = true;
  adapters::fuse_model(q, ad, tmp / "dq", dq);
  auto cfg = io::read_json(tmp / "dq" / "config.json");
  EXPECT_FALSE(cfg.contains("quantization") || cfg.contains("quantization_config"));
  auto dense = models::load_model(tmp / "dq", {at::kCPU, at::kFloat});
  const double dq_diff = max_abs_diff(logits_of(*dense, ids), expected);
  EXPECT_LT(dq_diff, 1e-4);
  auto dq_store = io::WeightStore::open(tmp / "dq");
  EXPECT_FALSE(dq_store.contains("model.layers.0.self_attn.q_proj.scales"));
  EXPECT_FALSE(dq_store.contains("model.embed_tokens.scales"));  // untargeted modules dequantized too

  // Requantized with the module's own spec (4 bits, group 32): each fused weight is exactly the
  // quantization of dequant(W) + scale·B·A, within one quantization step of it, and the model is
  // closer to the adapter's outputs than the base is.
  adapters::fuse_model(q, ad, tmp / "rq");
  EXPECT_TRUE(io::read_json(tmp / "rq" / "config.json").contains("quantization"));
  auto in = io::WeightStore::open(q);
  auto out = io::WeightStore::open(tmp / "rq");
  for (const auto& [path, m] : ad.modules) {
    auto qw = [&](const io::WeightStore& s) {
      nn::QuantizedWeight w;
      w.spec = {4, 32};
      w.wq = s.get(path + ".weight").view(at::kInt);
      w.scales = s.get(path + ".scales");
      w.biases = s.get(path + ".biases");
      return w;
    };
    const nn::QuantizedWeight fused = qw(out);
    at::Tensor want = nn::dequantize(qw(in), at::kFloat) + at::mm(m.b, m.a) * m.scale;
    const nn::QuantizedWeight requant = nn::quantize(want, {4, 32});
    EXPECT_TRUE(at::equal(fused.wq, requant.wq)) << path;
    EXPECT_TRUE(at::equal(fused.scales, requant.scales)) << path;
    const double step = fused.scales.abs().max().item<double>();
    EXPECT_LE(max_abs_diff(nn::dequantize(fused, at::kFloat), want), step) << path;
    EXPECT_GT(max_abs_diff(nn::dequantize(fused, at::kFloat), nn::dequantize(qw(in), at::kFloat)), step) << path;
  }
  EXPECT_TRUE(at::equal(in.get("model.embed_tokens.weight"), out.get("model.embed_tokens.weight")));
  auto requant = models::load_model(tmp / "rq", {at::kCPU, at::kFloat});
  const double err = max_abs_diff(logits_of(*requant, ids), expected);
  EXPECT_LT(err, 0.5 * max_abs_diff(base_logits, expected)) << "requantized fused model drifted";
  std::cout << "[ info ] q4 fuse: dequantized vs mounted " << dq_diff << ", requantized vs mounted " << err
            << " (base vs mounted " << max_abs_diff(base_logits, expected) << ")\n";
}

TEST(FuseCli, WritesFolderAndReportsErrors) {
  TempDir tmp;
  const std::string model = golden_model("llama_mha").string(), lora = golden_lora("llama_mha").string();
  auto r = run_hearth("fuse --model '" + model + "' --adapter-path '" + lora + "' --out '" + (tmp / "o").string() + "'");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(fs::exists(tmp / "o" / "model.safetensors"));
  r = run_hearth("fuse --model '" + model + "' --adapter-path '" + lora + "' --out '" + (tmp / "o").string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("already exists"), std::string::npos) << r.out;
  r = run_hearth("fuse --model '" + model + "' --adapter-path '" + (tmp / "missing").string() + "' --out '" +
                 (tmp / "o2").string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("adapter folder does not exist"), std::string::npos) << r.out;
}

TEST(GenerateCli, AdapterPathChangesTheContinuation) {
  const std::string model = golden_model("llama_mha").string(), lora = golden_lora("llama_mha").string();
  const std::string common = "generate --model '" + model + "' --prompt 'hello world' --max-tokens 12 --device cpu";
  auto base = run_hearth(common);
  auto with = run_hearth(common + " --adapter-path '" + lora + "'");
  ASSERT_EQ(base.rc, 0) << base.out;
  ASSERT_EQ(with.rc, 0) << with.out;
  const std::string base_text = base.out.substr(0, base.out.find("=========="));
  const std::string with_text = with.out.substr(0, with.out.find("=========="));
  EXPECT_NE(base_text, with_text);
  // The fused model generates what the mounted adapter generates.
  TempDir tmp;
  ASSERT_EQ(run_hearth("fuse --model '" + model + "' --adapter-path '" + lora + "' --out '" + (tmp / "f").string() + "'").rc, 0);
  auto fused = run_hearth("generate --model '" + (tmp / "f").string() + "' --prompt 'hello world' --max-tokens 12 --device cpu");
  ASSERT_EQ(fused.rc, 0) << fused.out;
  EXPECT_EQ(fused.out.substr(0, fused.out.find("==========")), with_text);
}

}  // namespace
