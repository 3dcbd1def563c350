// Mounting LoRA adapters on a model: the PEFT golden adapter reproduces PEFT's loss and the
// merged-weight forward, selection is per thread (inactive = byte-identical base), stacking sums,
// bad adapters leave the model untouched, trainable leaves get PEFT's gradients, dropout replays.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <thread>

#include "io/safetensors.h"
#include "lora_test_util.h"

namespace {
using namespace hearth;
using namespace hearth::testing;

bool any_adapters(models::Model& m) {
  for (auto& [p, lin] : m.linear_modules())
    if (lin->has_adapters()) return true;
  return false;
}

TEST(LinearModules, LlamaListsHfPaths) {
  auto m = load_tiny("llama_mha");
  auto mods = m->linear_modules();
  ASSERT_EQ(mods.size(), 2u * 7 + 1);
  EXPECT_EQ(mods[0].first, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(mods[6].first, "model.layers.0.mlp.down_proj");
  EXPECT_EQ(mods[13].first, "model.layers.1.mlp.down_proj");
  EXPECT_EQ(mods.back().first, "lm_head");
  EXPECT_EQ(mods[6].second->in_features(), 128);
  EXPECT_EQ(mods[6].second->out_features(), 64);
}

TEST(LinearModules, ResolveModulePathAcceptsAnotherWrappingOfTheSameCheckpoint) {
  const std::vector<std::string> vlm = {"lm_head", "model.language_model.embed_tokens.weight",
                                        "model.language_model.layers.0.mlp.up_proj",
                                        "model.language_model.layers.10.mlp.up_proj", "model.visual.blocks.0.mlp.up_proj"};
  using adapters::resolve_module_path;
  EXPECT_EQ(resolve_module_path("model.language_model.layers.0.mlp.up_proj", vlm), vlm[2]);  // itself
  EXPECT_EQ(resolve_module_path("model.layers.0.mlp.up_proj", vlm), vlm[2]);                 // text-only names
  EXPECT_EQ(resolve_module_path("language_model.model.layers.10.mlp.up_proj", vlm), vlm[3]);  // mlx-lm's
  EXPECT_EQ(resolve_module_path("model.embed_tokens.weight", vlm), vlm[1]);
  EXPECT_EQ(resolve_module_path("model.layers.1.mlp.up_proj", vlm), std::nullopt);  // not "layers.10"
  EXPECT_EQ(resolve_module_path("model.layers.0.mlp.down_proj", vlm), std::nullopt);
  const std::vector<std::string> two = {"a.layers.0.q", "b.layers.0.q"};
  EXPECT_EQ(resolve_module_path("model.layers.0.q", two), std::nullopt);  // ambiguous: refused, not guessed
}

// An adapter keyed by the text-only names mounts on the wrapped checkpoint (the same modules),
// and gives what the same tensors under the checkpoint's own names give.
TEST(Mount, TextOnlyNamesMountOnAWrappedQwen35) {
  const auto dir = hearth::testing::golden_model("qwen3_5/q35_vlm");
  auto model = models::load_model(dir, {at::kCPU, at::kFloat});
  const auto ids = at::arange(1, 9, at::kLong).view({1, 8});
  auto make = [&](const std::string& prefix, const std::string& id) {
    adapters::Adapter ad;
    ad.id = id;
    at::Generator gen = at::detail::createCPUGenerator(5);
    for (const auto& [path, lin] : model->linear_modules()) {
      if (path.find("mlp.up_proj") == std::string::npos) continue;
      const std::string tail = path.substr(path.find("layers."));
      ad.modules[prefix + tail] = nn::LoraAdapter{at::randn({2, lin->in_features()}, gen),
                                                  at::randn({lin->out_features(), 2}, gen), 0.5, 0.0};
    }
    return ad;
  };
  const adapters::Adapter own = make("model.language_model.", "own"), text = make("model.", "text");
  ASSERT_FALSE(text.modules.empty());
  adapters::mount(*model, own);
  adapters::mount(*model, text);
  at::Tensor a, b, base = logits_of(*model, ids);
  {
    nn::ActiveAdapters scope({"own"});
    a = logits_of(*model, ids);
  }
  {
    nn::ActiveAdapters scope({"text"});
    b = logits_of(*model, ids);
  }
  EXPECT_TRUE(a.equal(b));
  EXPECT_GT(max_abs_diff(a, base), 1e-3);
  adapters::Adapter both = make("model.", "both");
  for (const auto& [path, m] : own.modules) both.modules[path] = m;  // each layer under two names
  EXPECT_THROW(adapters::mount(*model, both), InvalidArgument);
}

TEST(Mount, PeftGoldenMatchesPeftLossAndMergedWeights) {
  for (const std::string variant : {"llama_mha", "llama_gqa_tied", "qwen3", "llama_bias"}) {
    SCOPED_TRACE(variant);
    auto model = load_tiny(variant);
    auto ad = adapters::load_adapter(golden_lora(variant));
    auto batch = golden_batch(variant);
    adapters::mount(*model, ad);
    at::Tensor lora;
    {
      nn::ActiveAdapters scope({ad.id});
      lora = logits_of(*model, batch.ids);
    }
    // PEFT's own loss on this batch (transformers + peft 0.21, fp32).
    const double loss = causal_lm_loss(lora, batch.labels).item<double>();
    EXPECT_NEAR(loss, batch.loss, 1e-4);
    // Merged-weight reference: W' = W + scale · B A.
    auto merged = load_tiny(variant);
    merge_into(*merged, ad);
    // x(W + sBA) and xW + s(xB)A round differently in fp32; the bound scales with the logits
    // (with PyTorch 2.11 on the GPU machine: 1.2e-5 for llama_gqa_tied).
    const at::Tensor merged_logits = logits_of(*merged, batch.ids);
    const double merged_diff = max_abs_diff(lora, merged_logits);
    const double scale = std::max(1.0, merged_logits.abs().max().item<double>());
    EXPECT_LT(merged_diff, 1e-5 * scale);
    std::cout << "[ info ] " << variant << ": |loss - PEFT loss| " << std::abs(loss - batch.loss)
              << ", max |logits - merged-weight logits| " << merged_diff << "\n";
    // And the adapter really changes the outputs.
    EXPECT_GT(max_abs_diff(lora, logits_of(*model, batch.ids)), 1e-2);
  }
}

TEST(Mount, InactiveIsByteIdenticalAndUnmountRestores) {
  auto model = load_tiny("llama_mha");
  auto batch = golden_batch("llama_mha");
  const at::Tensor base = logits_of(*model, batch.ids);
  auto ad = adapters::load_adapter(golden_lora("llama_mha"));
  adapters::mount(*model, ad);
  EXPECT_TRUE(at::equal(logits_of(*model, batch.ids), base));  // mounted, not active
  {
    nn::ActiveAdapters scope({"some_other_id"});
    EXPECT_TRUE(at::equal(logits_of(*model, batch.ids), base));
  }
  {
    nn::ActiveAdapters scope({ad.id});
    EXPECT_FALSE(at::equal(logits_of(*model, batch.ids), base));
    {
      nn::ActiveAdapters inner({});  // nested scope: base again, then restored
      EXPECT_TRUE(at::equal(logits_of(*model, batch.ids), base));
    }
    EXPECT_EQ(nn::ActiveAdapters::current(), std::vector<std::string>{ad.id});
    // Another thread has no scope: base outputs there.
    at::Tensor other;
    std::thread t([&] { other = logits_of(*model, batch.ids); });
    t.join();
    EXPECT_TRUE(at::equal(other, base));
  }
  EXPECT_EQ(adapters::unmount(*model, ad.id), 14);
  EXPECT_FALSE(any_adapters(*model));
  nn::ActiveAdapters scope({ad.id});
  EXPECT_TRUE(at::equal(logits_of(*model, batch.ids), base));
  EXPECT_EQ(adapters::unmount(*model, ad.id), 0);
}

TEST(Mount, StackedAdaptersSum) {
  auto model = load_tiny("llama_mha");
  auto batch = golden_batch("llama_mha");
  auto a = adapters::load_adapter(golden_lora("llama_mha"));
  a.id = "a";
  // b: another adapter on a subset of modules (layer 1 only), different values and scale.
  adapters::Adapter b;
  b.id = "b";
  at::manual_seed(3);
  for (const auto& [path, m] : a.modules) {
    if (adapters::layer_index(path) != 1) continue;
    b.modules[path] = nn::LoraAdapter{at::randn_like(m.a) * 0.3, at::randn_like(m.b) * 0.1, 0.7};
  }
  adapters::mount(*model, a);
  adapters::mount(*model, b);
  // One Linear: y_ab = base + Δa + Δb exactly as computed separately.
  nn::Linear* q1 = nullptr;
  for (auto& [p, lin] : model->linear_modules())
    if (p == "model.layers.1.self_attn.q_proj") q1 = lin;
  ASSERT_NE(q1, nullptr);
  at::Tensor x = at::randn({3, 64});
  at::Tensor y0 = q1->forward(x), ya, yb, yab;
  {
    nn::ActiveAdapters s({"a"});
    ya = q1->forward(x);
  }
  {
    nn::ActiveAdapters s({"b"});
    yb = q1->forward(x);
  }
  {
    nn::ActiveAdapters s(nn::parse_adapter_spec("a+b"));
    yab = q1->forward(x);
  }
  EXPECT_LT(max_abs_diff(yab, y0 + (ya - y0) + (yb - y0)), 1e-5);
  EXPECT_GT(max_abs_diff(yab, ya), 1e-2);
  // Whole model: stacked == both merged into the weights.
  at::Tensor stacked;
  {
    nn::ActiveAdapters s(nn::parse_adapter_spec("a,b"));
    stacked = logits_of(*model, batch.ids);
  }
  auto merged = load_tiny("llama_mha");
  merge_into(*merged, a);
  merge_into(*merged, b);
  EXPECT_LT(max_abs_diff(stacked, logits_of(*merged, batch.ids)), 1e-5);
}

TEST(Mount, ParseAdapterSpec) {
  EXPECT_EQ(nn::parse_adapter_spec(""), std::vector<std::string>{});
  EXPECT_EQ(nn::parse_adapter_spec("none"), std::vector<std::string>{});
  EXPECT_EQ(nn::parse_adapter_spec("x"), std::vector<std::string>{"x"});
  EXPECT_EQ(nn::parse_adapter_spec("a+b,c"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_THROW(nn::parse_adapter_spec("a++b"), InvalidArgument);
  EXPECT_THROW(nn::parse_adapter_spec("a+a"), InvalidArgument);  // would apply it twice
  EXPECT_THROW(nn::parse_adapter_spec("a,b+a"), InvalidArgument);
}

void expect_mount_error(models::Model& model, const adapters::Adapter& ad, const std::string& needle) {
  const at::Tensor ids = at::arange(8, at::kLong).view({1, 8});
  const at::Tensor before = logits_of(model, ids);
  try {
    adapters::mount(model, ad);
    ADD_FAILURE() << "mount accepted a bad adapter (" << needle << ")";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_FALSE(any_adapters(model));
  nn::ActiveAdapters scope({ad.id});
  EXPECT_TRUE(at::equal(logits_of(model, ids), before));
}

TEST(Mount, RejectsBadAdaptersAndLeavesModelUnchanged) {
  auto model = load_tiny("llama_mha");
  const auto good = adapters::load_adapter(golden_lora("llama_mha"));
  {
    auto ad = good;  // the last module (sorted) is broken: earlier ones must not stay mounted
    auto& m = ad.modules.rbegin()->second;
    m.a = at::zeros({4, 63});
    expect_mount_error(*model, ad, ad.modules.rbegin()->first + ": LoRA A (rank 4) takes 63 input features, the model's Linear 64");
  }
  {
    auto ad = good;
    ad.modules["model.layers.1.self_attn.v_proj"].b = at::zeros({63, 4});
    expect_mount_error(*model, ad, "model.layers.1.self_attn.v_proj: LoRA B (rank 4) gives 63 output features, the model's Linear 64");
  }
  {
    auto ad = good;
    ad.modules["model.layers.0.mlp.up_proj"].b = at::zeros({128, 3});
    expect_mount_error(*model, ad, "model.layers.0.mlp.up_proj: rank mismatch");
  }
  {
    auto ad = good;
    ad.modules["model.layers.7.self_attn.q_proj"] = good.modules.begin()->second;
    expect_mount_error(*model, ad, "model.layers.7.self_attn.q_proj: no such module");
  }
  {
    auto ad = good;
    ad.id = "a+b";
    expect_mount_error(*model, ad, "contain no '+', ','");
  }
  // Mounting the same id twice is refused (and the first mount stays intact).
  adapters::mount(*model, good);
  EXPECT_THROW(adapters::mount(*model, good), Error);
  EXPECT_EQ(adapters::unmount(*model, good.id), 14);
}

TEST(Trainable, GradientsMatchPeft) {
  // The golden adapter's tensors as trainable leaves: loss and d loss / d A, B equal PEFT's.
  auto model = load_tiny("llama_mha");
  auto ad = adapters::load_adapter(golden_lora("llama_mha"));
  for (auto& [p, m] : ad.modules) {
    m.a = m.a.clone().set_requires_grad(true);
    m.b = m.b.clone().set_requires_grad(true);
  }
  adapters::mount(*model, ad);
  auto batch = golden_batch("llama_mha");
  nn::ActiveAdapters scope({ad.id});
  at::Tensor loss = causal_lm_loss(model->forward(batch.ids, 0, nullptr), batch.labels);
  EXPECT_NEAR(loss.item<double>(), batch.loss, 1e-4);
  loss.backward();
  auto grads = io::SafetensorsFile::open(golden_lora("llama_mha") / "grads.safetensors");
  int checked = 0;
  double worst = 0.0;
  for (auto& [p, m] : ad.modules) {
    for (auto [t, name] : {std::pair{m.a, ".lora_A.default.weight"}, std::pair{m.b, ".lora_B.default.weight"}}) {
      at::Tensor ref = grads->tensor("base_model.model." + p + name);
      ASSERT_TRUE(t.grad().defined()) << p << name;
      const double rel = max_abs_diff(t.grad(), ref) / ref.abs().max().item<double>();
      EXPECT_LT(rel, 1e-5) << p << name;
      worst = std::max(worst, rel);
      ++checked;
    }
  }
  std::cout << "[ info ] |loss - PEFT| " << std::abs(loss.item<double>() - batch.loss)
            << ", worst relative LoRA grad error vs PEFT " << worst << "\n";
  EXPECT_EQ(checked, 28);
}

TEST(Trainable, AttachSelectsModulesAndInitsLikePeft) {
  auto model = load_tiny("llama_mha");
  const at::Tensor ids = at::arange(10, at::kLong).view({1, 10});
  const at::Tensor base = logits_of(*model, ids);
  adapters::LoraConfig cfg;
  cfg.rank = 4;
  cfg.scale = 2.0;
  auto ad = adapters::attach_trainable(*model, cfg, /*seed=*/5);
  EXPECT_EQ(ad.modules.size(), 14u);
  for (const auto& [p, m] : ad.modules) {
    EXPECT_TRUE(m.a.requires_grad() && m.a.is_leaf());
    EXPECT_TRUE(m.b.requires_grad() && m.b.is_leaf());
    EXPECT_EQ(m.b.abs().max().item<float>(), 0.0f);
    const double bound = 1.0 / std::sqrt(double(m.a.size(1)));
    EXPECT_LE(m.a.abs().max().item<double>(), bound);
    EXPECT_GT(m.a.abs().max().item<double>(), 0.8 * bound);  // actually spread over the range
  }
  // The leaves ARE what the model uses: B = 0 gives the base; an in-place B update shows up.
  {
    nn::ActiveAdapters scope({"train"});
    EXPECT_TRUE(at::equal(logits_of(*model, ids), base));
    {
      c10::NoGradGuard g;
      ad.modules.begin()->second.b.fill_(0.05);
    }
    EXPECT_GT(max_abs_diff(logits_of(*model, ids), base), 1e-4);
  }
  // Same seed → same A; other seed → other A; selection by keys and num_layers.
  auto m2 = load_tiny("llama_mha");
  auto same = adapters::attach_trainable(*m2, cfg, 5, "t2");
  EXPECT_TRUE(at::equal(same.modules.begin()->second.a, ad.modules.begin()->second.a));
  auto m3 = load_tiny("llama_mha");
  adapters::LoraConfig sub = cfg;
  sub.keys = {"q_proj", "mlp.down_proj"};
  sub.num_layers = 1;
  auto part = adapters::attach_trainable(*m3, sub, 6, "t3");
  ASSERT_EQ(part.modules.size(), 2u);
  EXPECT_TRUE(part.modules.count("model.layers.1.self_attn.q_proj"));
  EXPECT_TRUE(part.modules.count("model.layers.1.mlp.down_proj"));
  EXPECT_FALSE(at::equal(part.modules.begin()->second.a, ad.modules.at(part.modules.begin()->first).a));
  EXPECT_EQ(adapters::layer_params(part, 1, 2).size(), 4u);
  EXPECT_EQ(adapters::layer_params(part, 0, 1).size(), 0u);
  sub.keys = {"no_such_proj"};
  EXPECT_THROW(adapters::attach_trainable(*m3, sub, 6, "t4"), InvalidArgument);
  // One unknown key beside known ones is accepted under PEFT's rule (the known ones train) and
  // refused by name when the keys were the user's (every_key_must_match: --lora-keys).
  sub.keys = {"q_proj", "no_such_proj"};
  EXPECT_GT(adapters::attach_trainable(*m3, sub, 6, "t4b").modules.size(), 0u);
  sub.every_key_must_match = true;
  try {
    adapters::attach_trainable(*m3, sub, 6, "t5");
    ADD_FAILURE() << "an unknown LoRA key was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'no_such_proj' matches no module"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("self_attn.q_proj"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
  // A key that exists only in layers --num-layers leaves out is not a typo: the others train.
  auto m4 = load_tiny("llama_mha");
  sub.keys = {"q_proj", "mlp.down_proj"};
  sub.num_layers = 1;
  EXPECT_EQ(adapters::attach_trainable(*m4, sub, 6, "t6").modules.size(), 2u);
}

TEST(Trainable, DropoutOnlyInScopeAndReplays) {
  at::manual_seed(1);
  nn::Linear lin(at::randn({16, 32}));
  lin.add_adapter("d", nn::LoraAdapter{at::randn({4, 32}), at::randn({16, 4}), 2.0, 0.5});
  at::Tensor x = at::randn({5, 32});
  nn::ActiveAdapters scope({"d"});
  const at::Tensor plain = lin.forward(x);
  const at::Tensor expect_plain = at::linear(x, lin.weight()) + at::linear(at::linear(x, lin.find_adapter("d")->a),
                                                                           lin.find_adapter("d")->b) * 2.0;
  // Within fp32 rounding of outputs near 30 (the products sum in nn/cpu_gemm.h's order, not BLAS's).
  EXPECT_LT(max_abs_diff(plain, expect_plain), 1e-6 * (1.0 + expect_plain.abs().max().item<double>()));
  at::Tensor d1, d2, d3;
  {
    nn::LoraDropoutScope train(42);
    EXPECT_TRUE(nn::LoraDropoutScope::enabled());
    d1 = lin.forward(x);
    nn::LoraDropoutScope::reseed(42);
    d2 = lin.forward(x);
    d3 = lin.forward(x);  // the stream moved on: a new mask
  }
  EXPECT_FALSE(nn::LoraDropoutScope::enabled());
  EXPECT_TRUE(at::equal(d1, d2));
  EXPECT_FALSE(at::equal(d1, d3));
  EXPECT_GT(max_abs_diff(d1, plain), 1e-3);
  EXPECT_TRUE(at::equal(lin.forward(x), plain));
  // Inverted dropout (torch.nn.Dropout): with A = B = I the branch is dropout(x), each element 0
  // or x / (1 - p), zeroed with probability p.
  nn::Linear id(at::zeros({64, 64}));
  id.add_adapter("d", nn::LoraAdapter{at::eye(64), at::eye(64), 1.0, 0.25});
  at::Tensor big = at::rand({200, 64}) + 0.5;
  at::Tensor z;
  {
    nn::LoraDropoutScope train(7);
    z = id.forward(big);
  }
  at::Tensor kept = z.ne(0);
  EXPECT_LT(max_abs_diff(at::where(kept, z, at::zeros_like(z)), at::where(kept, big / 0.75, at::zeros_like(z))), 1e-5);
  EXPECT_NEAR(1.0 - kept.to(at::kFloat).mean().item<double>(), 0.25, 0.02);
}

}  // namespace
