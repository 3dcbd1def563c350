// bf16 mixed-precision training (fp32 masters) against fp32 on the tiny golden model, its
// checkpoints and resume, and the AdamW step (plain and fused) against torch::optim::AdamW.
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <atomic>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train/loss.h"
#include "train/mixed_precision.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "../io/io_test_util.h"
#include "train_test_util.h"

namespace hearth::train {
namespace {

using namespace hearth::train::testing;
namespace fs = std::filesystem;

void mp_write_data(const fs::path& dir) {
  const char* rows[] = {"the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
                        "all that glitters is not gold",        "the early bird catches the worm",
                        "actions speak louder than words",       "practice makes perfect every day",
                        "where there is smoke there is fire",    "the pen is mightier than the sword"};
  std::string train;
  for (const char* r : rows) train += std::string("{\"text\": \"") + r + "\"}\n";
  hearth::io::write_file_atomic(dir / "train.jsonl", train);
  hearth::io::write_file_atomic(dir / "valid.jsonl", "{\"text\": \"the lazy dog sleeps\"}\n{\"text\": \"time saves nine\"}\n");
}

TrainConfig config(const fs::path& data, const fs::path& out, const std::string& mp) {
  TrainConfig c;
  c.data_dir = data;
  c.adapter_path = out;
  c.fine_tune_type = "full";
  c.batch_size = 2;
  c.iters = 20;
  c.learning_rate = 3e-3;
  c.lr_schedule = "cosine";
  c.warmup = 2;
  c.weight_decay = 0.01;
  c.grad_accumulation_steps = 2;
  c.grad_clip = 1.0;
  c.steps_per_report = 5;
  c.steps_per_eval = 10;
  c.save_every = 0;
  c.seed = 3;
  c.max_seq_length = 12;
  c.mixed_precision = mp;
  return c;
}

std::unique_ptr<hearth::models::Model> tiny_model(at::ScalarType dtype) {
  return hearth::models::load_model(golden("models/llama_mha"), hearth::nn::LoadOptions{at::kCPU, dtype});
}
hearth::tokenizer::Tokenizer mp_tiny_tok() { return hearth::tokenizer::Tokenizer::from_dir(golden("models/llama_mha")); }

// The two runs' per-step loss differences: max and mean |Δ|.
std::pair<double, double> loss_gap(const TrainResult& a, const TrainResult& b) {
  EXPECT_EQ(a.step_losses.size(), b.step_losses.size());
  double mx = 0, sum = 0;
  for (size_t i = 0; i < a.step_losses.size() && i < b.step_losses.size(); ++i) {
    const double d = std::abs(a.step_losses[i] - b.step_losses[i]);
    std::printf("[mixed] step %2zu: fp32 %.5f bf16-mixed %.5f |d| %.5f\n", i + 1, a.step_losses[i], b.step_losses[i], d);
    mx = std::max(mx, d);
    sum += d;
  }
  return {mx, sum / std::max<size_t>(a.step_losses.size(), 1)};
}

}  // namespace

// The per-tensor path is torch::optim::AdamW op for op (bit-identical); the fused kernel, where
// the build has it (PyTorch >= 2.4), agrees within 1e-6 relative.
TEST(FusedAdamW, MatchesTorchAdamW) {
  at::manual_seed(11);
  const std::vector<std::vector<int64_t>> shapes{{5, 7}, {3}, {16, 4}};
  std::vector<at::Tensor> init;
  for (const auto& s : shapes) init.push_back(at::randn(s));
  std::vector<std::vector<at::Tensor>> grads(6);
  for (auto& g : grads)
    for (const auto& s : shapes) g.push_back(at::randn(s));
  auto leaves = [&] {
    std::vector<at::Tensor> v;
    for (const auto& t : init) v.push_back(t.clone().requires_grad_(true));
    return v;
  };
  AdamWConfig cfg;
  cfg.lr = 1e-2;
  cfg.weight_decay = 0.05;
  // reference
  std::vector<at::Tensor> ref = leaves();
  torch::optim::AdamW torch_opt(ref, torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  for (const auto& g : grads) {
    for (size_t i = 0; i < ref.size(); ++i) ref[i].mutable_grad() = g[i].clone();
    torch_opt.step();
  }
  for (bool fused : {false, true}) {
    std::vector<at::Tensor> w = leaves();
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (size_t i = 0; i < w.size(); ++i) named.emplace_back("p" + std::to_string(i), w[i]);
    AdamWConfig c = cfg;
    c.fused = fused;
    NamedAdamW opt(named, c);
    for (const auto& g : grads) {
      for (size_t i = 0; i < w.size(); ++i) w[i].mutable_grad() = g[i].clone();
      opt.step();
      opt.zero_grad();
    }
    std::printf("[adamw] fused requested %d, ran fused %d\n", fused, opt.fused());
    if (!fused) EXPECT_FALSE(opt.fused());
    for (size_t i = 0; i < w.size(); ++i) {
      if (!opt.fused()) EXPECT_TRUE(w[i].detach().equal(ref[i].detach())) << "tensor " << i;
      EXPECT_LE(rel_err(w[i].detach(), ref[i].detach()), 1e-6) << "tensor " << i << " fused " << fused;
      EXPECT_GT((w[i].detach() - init[i]).abs().max().item<float>(), 1e-3f);  // it moved
    }
    // state layout of existing checkpoints: <name>.exp_avg / .exp_avg_sq (param dtype) / .step (int64 [1])
    auto st = opt.state_tensors();
    ASSERT_EQ(st.size(), 9u);
    EXPECT_EQ(st.at("p0.step").scalar_type(), at::kLong);
    EXPECT_EQ(st.at("p0.step").item<int64_t>(), 6);
    EXPECT_EQ(st.at("p1.exp_avg_sq").sizes(), at::IntArrayRef({3}));
  }
}

TEST(MixedPrecision, FlagValues) {
  EXPECT_FALSE(parse_mixed_precision("none"));
  EXPECT_TRUE(parse_mixed_precision("bf16"));
  try {
    parse_mixed_precision("fp16");
    ADD_FAILURE() << "fp16 accepted";
  } catch (const hearth::Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss scaling"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_mixed_precision("bfloat16"), hearth::Error);
  hearth::testing::TempDir d;
  mp_write_data(d.path());
  auto tok = mp_tiny_tok();
  auto m = tiny_model(at::kFloat);  // mixed needs the bf16 compute copy
  EXPECT_THROW(run_training(config(d.path(), d.path() / "o", "bf16"), *m, tok), hearth::Error);
}

// accumulate_grads_of (a data-parallel segment's tensors, early) then accumulate_grads (the rest)
// gives the masters exactly what accumulate_grads alone does, and returns the masters in order.
TEST(MixedPrecision, AccumulatingASubsetFirstGivesTheSameMasterGrads) {
  const auto params = [] {
    std::vector<TrainableParam> ps;
    for (int i = 0; i < 3; ++i)
      ps.push_back({"p" + std::to_string(i), at::zeros({4}, at::kBFloat16).requires_grad_(true), i});
    ps.push_back({"f", at::zeros({2}).requires_grad_(true), 3});  // fp32: its own master
    return ps;
  };
  const auto set_grads = [](const std::vector<TrainableParam>& ps, double v) {
    for (size_t i = 0; i < ps.size(); ++i)
      ps[i].tensor.mutable_grad() = at::full(ps[i].tensor.sizes(), v * (1.0 + 0.37 * static_cast<double>(i)),
                                             ps[i].tensor.options());
  };
  auto pa = params(), pb = params();
  MasterWeights a(pa, true), b(pb, true);
  set_grads(pa, 1.3);
  set_grads(pb, 1.3);
  a.accumulate_grads();
  b.accumulate_grads();  // an earlier micro-batch
  set_grads(pa, 0.7);
  set_grads(pb, 0.7);
  a.accumulate_grads();
  const auto got = b.accumulate_grads_of({pb[2].tensor, at::zeros({1}), pb[3].tensor, pb[0].tensor});
  ASSERT_EQ(got.size(), 3u);  // the stranger is skipped
  EXPECT_TRUE(got[0].is_same(b.masters()[2].tensor));
  EXPECT_TRUE(got[1].is_same(pb[3].tensor));  // fp32: itself
  EXPECT_TRUE(got[2].is_same(b.masters()[0].tensor));
  EXPECT_FALSE(pb[2].tensor.grad().defined());  // moved into the master
  b.accumulate_grads();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(a.masters()[i].tensor.grad().scalar_type(), at::kFloat) << i;
    EXPECT_TRUE(at::equal(a.masters()[i].tensor.grad(), b.masters()[i].tensor.grad())) << i;
  }
}

// Tolerance: bf16 keeps 8 significant bits (relative rounding 2^-9 ≈ 0.002) in every matmul and
// activation; over 20 steps of this 2-layer model that moves the token-mean loss (≈ 6.2 → ≈ 2)
// by a few 1e-3 and at most ~1e-2. A max gap of 0.05 and a mean of 0.02 are far below the ~4
// nats the run descends, and far above what rounding gives, so a real defect (fp32 state lost,
// gradients dropped or doubled, masters not copied back) fails.
TEST(MixedPrecision, Bf16FullFineTuneTracksFp32AndKeepsFp32Masters) {
  hearth::testing::TempDir d;
  mp_write_data(d.path());
  auto tok = mp_tiny_tok();
  auto m32 = tiny_model(at::kFloat);
  TrainResult a = run_training(config(d.path(), d.path() / "fp32", "none"), *m32, tok);
  auto m16 = tiny_model(at::kBFloat16);
  TrainResult b = run_training(config(d.path(), d.path() / "bf16", "bf16"), *m16, tok);
  ASSERT_EQ(a.step_losses.size(), 20u);
  const auto [mx, mean] = loss_gap(a, b);
  std::printf("[mixed] max |d| %.5f mean |d| %.5f\n", mx, mean);
  EXPECT_LT(mx, 0.05);
  EXPECT_LT(mean, 0.02);
  EXPECT_LT(b.step_losses.back(), b.step_losses.front() - 1.0);  // it trained
  // The saved weights and the checkpoint's params and AdamW state are fp32; the model holds their
  // bf16 rounding.
  auto w = hearth::io::SafetensorsFile::open(d.path() / "bf16/adapters.safetensors");
  std::map<std::string, at::Tensor> model_w;
  for (auto& [n, t] : m16->named_parameters()) model_w[n] = t;
  ASSERT_GT(w->tensors().size(), 0u);
  for (const auto& info : w->tensors()) {
    at::Tensor t = w->tensor(info.name);
    EXPECT_EQ(t.scalar_type(), at::kFloat) << info.name;
    ASSERT_TRUE(model_w.count(info.name)) << info.name;
    EXPECT_EQ(model_w[info.name].scalar_type(), at::kBFloat16) << info.name;
    EXPECT_TRUE(model_w[info.name].detach().equal(t.to(at::kBFloat16))) << info.name;
  }
  const std::string opt_file = hearth::io::read_json(d.path() / "bf16/checkpoint.json")["optimizer"];
  auto o = hearth::io::SafetensorsFile::open(d.path() / "bf16" / opt_file);
  int fp32_state = 0;
  for (const auto& info : o->tensors()) {
    const at::Tensor t = o->tensor(info.name);
    if (info.name.rfind(".step") == info.name.size() - 5) continue;
    EXPECT_EQ(t.scalar_type(), at::kFloat) << info.name;
    ++fp32_state;
  }
  EXPECT_EQ(fp32_state, 3 * static_cast<int>(w->tensors().size()));  // param + exp_avg + exp_avg_sq
}

TEST(MixedPrecision, Bf16ResumeGivesTheSameLosses) {
  hearth::testing::TempDir d;
  mp_write_data(d.path());
  auto tok = mp_tiny_tok();
  TrainConfig c = config(d.path(), d.path() / "straight", "bf16");
  c.iters = 6;
  c.steps_per_report = 1;
  TrainResult straight;
  {
    auto m = tiny_model(at::kBFloat16);
    straight = run_training(c, *m, tok);
  }
  std::atomic<bool> stop{false};
  c.adapter_path = d.path() / "split";
  c.stop = &stop;
  TrainResult first, second;
  {
    auto m = tiny_model(at::kBFloat16);
    first = run_training(c, *m, tok, [&](const Report& r) {
      if (r.step == 3) stop = true;
    });
  }
  ASSERT_EQ(first.steps_done, 3);
  c.stop = nullptr;
  c.resume = c.adapter_path;
  {
    auto m = tiny_model(at::kBFloat16);  // a fresh bf16 model: the masters come from the checkpoint
    second = run_training(c, *m, tok);
  }
  ASSERT_EQ(first.step_losses.size(), 3u);
  ASSERT_EQ(second.step_losses.size(), 3u);
  for (int i = 0; i < 6; ++i) {
    const double got = i < 3 ? first.step_losses[i] : second.step_losses[i - 3];
    EXPECT_EQ(got, straight.step_losses[i]) << "step " << i + 1;
  }
  auto a = hearth::io::SafetensorsFile::open(d.path() / "straight/adapters.safetensors");
  auto b = hearth::io::SafetensorsFile::open(d.path() / "split/adapters.safetensors");
  for (const auto& info : a->tensors()) EXPECT_TRUE(a->tensor(info.name).equal(b->tensor(info.name))) << info.name;
}

// LoRA: the base stays bf16 and frozen, A/B train (and are saved) in fp32. Tolerance: "within
// noise", measured. LoRA at lr 1e-2 and scale 20 on 8 rows is a sensitive regime, so the noise
// floor is taken from two fp32 runs whose bases differ only by bf16 rounding (2^-9 relative): the
// mixed run must stay as close to fp32 as that perturbation alone moves it (x2, + 0.02).
TEST(MixedPrecision, Bf16LoraTrainsFp32AdaptersOverABf16Base) {
  hearth::testing::TempDir d;
  mp_write_data(d.path());
  auto tok = mp_tiny_tok();
  auto lora = [&](const std::string& mp, at::ScalarType dt, bool round_base, const char* out) {
    TrainConfig c = config(d.path(), d.path() / out, mp);
    c.fine_tune_type = "lora";
    c.lora_rank = 4;
    c.learning_rate = 1e-2;
    auto m = tiny_model(dt);
    if (round_base) {  // fp32 weights holding their bf16 rounding: the mixed run's base, in fp32
      c10::NoGradGuard no_grad;
      for (auto& [n, t] : m->named_parameters()) t.detach().copy_(t.detach().to(at::kBFloat16));
    }
    at::Tensor q = m->named_parameters().back().second.detach().clone();
    TrainResult r = run_training(c, *m, tok);
    EXPECT_TRUE(m->named_parameters().back().second.detach().equal(q)) << "the base moved";
    return r;
  };
  TrainResult a = lora("none", at::kFloat, false, "fp32"), b = lora("bf16", at::kBFloat16, false, "bf16");
  TrainResult r = lora("none", at::kFloat, true, "fp32r");
  const auto [mx, mean] = loss_gap(a, b);
  const auto [nmx, nmean] = loss_gap(a, r);
  std::printf("[mixed-lora] max |d| %.5f mean |d| %.5f; noise floor (fp32 vs fp32 on the rounded base) max %.5f mean %.5f\n",
              mx, mean, nmx, nmean);
  EXPECT_LT(mx, 2 * nmx + 0.02);
  EXPECT_LT(mean, 2 * nmean + 0.02);
  EXPECT_LT(b.step_losses.back(), b.step_losses.front() - 0.5);
  auto w = hearth::io::SafetensorsFile::open(d.path() / "bf16/adapters.safetensors");
  ASSERT_GT(w->tensors().size(), 0u);
  for (const auto& info : w->tensors()) EXPECT_EQ(w->tensor(info.name).scalar_type(), at::kFloat) << info.name;
}

// The deferred loss is the synced one, as a device scalar.
TEST(ChunkedCrossEntropy, DeferredLossEqualsTheSyncedSum) {
  at::manual_seed(5);
  at::Tensor h = at::randn({2, 7, 8}), w = at::randn({11, 8});
  at::Tensor tg = at::randint(0, 11, {2, 7}, at::kLong);
  tg[0][2] = kIgnoreIndex;
  tg[1][6] = kIgnoreIndex;
  auto head = [&](const at::Tensor& x) { return at::matmul(x, w.t()); };
  HeadVjp s = chunked_cross_entropy_vjp(h, tg, head, 3, 0.5);
  HeadVjp l = chunked_cross_entropy_vjp(h, tg, head, 3, 0.5, {}, /*defer_loss=*/true);
  EXPECT_EQ(l.loss_sum, 0.0);
  EXPECT_EQ(l.loss.item<double>(), s.loss_sum);
  EXPECT_EQ(l.n_tokens, 12);
  EXPECT_TRUE(l.grad_hidden.equal(s.grad_hidden));
  // against a plain log-softmax over the supervised positions
  at::Tensor lp = at::log_softmax(head(h).reshape({14, 11}), -1);
  double want = 0;
  for (int64_t i = 0; i < 14; ++i) {
    const int64_t t = tg.reshape({14})[i].item<int64_t>();
    if (t != kIgnoreIndex) want -= lp[i][t].item<double>();
  }
  EXPECT_NEAR(s.loss_sum, want, 1e-4);
}

// An fp32 checkpoint's own tensors start the masters (cfg.master_init): with lr 0 the saved fp32
// weights are the checkpoint's exactly, not their bf16 rounding (which they are without it).
TEST(MixedPrecision, MasterInitKeepsTheFp32CheckpointValues) {
  hearth::testing::TempDir d;
  mp_write_data(d.path());
  auto tok = mp_tiny_tok();
  auto f32 = tiny_model(at::kFloat);
  std::map<std::string, at::Tensor> orig;
  for (auto& [n, t] : f32->named_parameters()) orig[n] = t.detach();
  for (bool with_init : {true, false}) {
    TrainConfig c = config(d.path(), d.path() / (with_init ? "init" : "plain"), "bf16");
    c.iters = 1;
    c.learning_rate = 0;
    c.weight_decay = 0;
    if (with_init) c.master_init = orig;
    auto m = tiny_model(at::kBFloat16);
    run_training(c, *m, tok);
    auto w = hearth::io::SafetensorsFile::open(c.adapter_path / "adapters.safetensors");
    int exact = 0, n = 0;
    for (const auto& info : w->tensors()) {
      ++n;
      exact += w->tensor(info.name).equal(orig.at(info.name));
    }
    if (with_init) EXPECT_EQ(exact, n);
    else EXPECT_LT(exact, n);  // the bf16 rounding of random weights differs from them
  }
  TrainConfig bad = config(d.path(), d.path() / "bad", "bf16");
  bad.master_init["model.norm.weight"] = at::zeros({3});
  auto m = tiny_model(at::kBFloat16);
  EXPECT_THROW(run_training(bad, *m, tok), hearth::Error);
}

// The segmented backward in bf16 (a mixed-precision run's compute) gives the full backward's
// gradients: both run the same bf16 ops, so they agree as in fp32 (≤ 1e-6 relative).
TEST(MixedPrecision, Bf16SegmentedEqualsFullBackward) {
  auto m = tiny_model(at::kBFloat16);
  auto params = full_parameters(*m, -1);
  LayerStack stack = make_layer_stack(*m, params);
  at::manual_seed(2);
  at::Tensor ids = at::randint(3, 500, {2, 11}, at::kLong);
  at::Tensor targets = shift_labels(ids);
  auto grads = [&](int64_t seg) {
    zero(params);
    BackwardOptions o;
    o.segment_size = seg;
    o.loss_chunk = 4;
    BackwardResult r = backward(stack, ids, targets, o);
    std::vector<at::Tensor> g;
    for (const auto& p : params) g.push_back(p.tensor.grad().clone());
    return std::make_pair(r.loss_sum, g);
  };
  auto [full_loss, full] = grads(0);
  for (int64_t seg : {1, 2}) {
    auto [loss, g] = grads(seg);
    EXPECT_EQ(loss, full_loss) << "segment " << seg;
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_EQ(g[i].scalar_type(), at::kBFloat16);
      EXPECT_LE(rel_err(g[i], full[i]), 1e-6) << params[i].name << " segment " << seg;
    }
  }
}

}  // namespace hearth::train
