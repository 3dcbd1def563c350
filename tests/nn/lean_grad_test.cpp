// The lean training Functions (nn/lean_grad.h) against the reference ops they replace, on the CPU
// in fp32 and bf16 with real values: RMSNorm (RMSNorm::forward / forward_add) and RoPE
// (nn::apply_rotary, full and partial rotary, strided q, per-row cos/sin) forward bit-identical to
// the reference ops with and without grad; RoPE's backward bit-identical to autograd of the
// reference; RMSNorm's gradients (x and weight) those of the reference within fp32 rounding (bf16:
// within one bf16 rounding, nearly all equal); the RMSNorm graph keeps no fp32 copy of its input;
// and the peak memory of a forward + backward of each (and of one bf16 llama layer) in a child
// process, reference vs lean. On CUDA with PyTorch >= 2.5 (skipped elsewhere): attention's
// enable_gqa training path gives the repeat_kv path's output, dk and dv bit for bit.
#include <gtest/gtest.h>

#include <unistd.h>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/torch_compat.h"
#include "nn/attention.h"
#include "nn/fused_ops.h"
#include "nn/lean_grad.h"
#include "nn/rms_norm.h"
#include "nn/rope.h"

namespace {

namespace nn = hearth::nn;
namespace compat = hearth::compat;

// Restores the lean switch at the end of a test.
struct LeanGradSwitch {
  bool was;
  explicit LeanGradSwitch(bool on) : was(nn::set_lean_grad(on)) {}
  ~LeanGradSwitch() { nn::set_lean_grad(was); }
};

struct LeanGradGrads {
  at::Tensor y, dx, dw;
};

// y = norm(x) with grad (lean on or off), then y.backward(gy): y and the gradients of x and w.
LeanGradGrads lean_grad_norm_run(bool lean, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& gy,
                                 bool train_w) {
  LeanGradSwitch sw(lean);
  at::Tensor x = x0.clone().requires_grad_(true);
  at::Tensor w = w0.clone().requires_grad_(train_w);
  nn::RMSNorm norm(w, 1e-5);
  at::Tensor y = norm.forward(x);
  EXPECT_EQ(y.grad_fn()->name().find("RmsNormFn") != std::string::npos, lean) << y.grad_fn()->name();
  y.backward(gy);
  return {y.detach(), x.grad(), train_w ? w.grad() : at::Tensor()};
}

// Largest |a − b| in units of the bf16 spacing at |b| (2^(exponent(b) − 7)); 0 when equal.
double lean_grad_bf16_ulps(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  at::Tensor spacing = at::pow(2.0, at::floor(at::log2(y.abs().clamp_min(1e-30))) - 7);
  return ((x - y).abs() / spacing).max().item<double>();
}

double lean_grad_rel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return ((x - y).abs().max() / y.abs().max()).item<double>();
}

// Rows of very different scales (1e-3 .. 1e2), so rstd and the fp32 rounding vary.
at::Tensor lean_grad_rows(std::vector<int64_t> shape, at::ScalarType dt) {
  at::Tensor x = at::randn(shape, at::kDouble);
  at::Tensor scale = at::pow(10.0, at::rand(std::vector<int64_t>(shape.begin(), shape.end() - 1), at::kDouble) * 5 - 3);
  return (x * scale.unsqueeze(-1)).to(dt);
}

}  // namespace

TEST(LeanGrad, RmsNormForwardIsTheReferenceBitForBit) {
  at::manual_seed(11);
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = lean_grad_rows({3, 37, 96}, dt), r = lean_grad_rows({3, 37, 96}, dt);
    const at::Tensor w = (1 + 0.2 * at::randn({96})).to(dt);
    at::Tensor ref, ref_sum, ref_add;
    {
      c10::NoGradGuard no_grad;
      const nn::FusedDecodeOff reference_ops;  // LlamaRMSNorm's ops (the CPU's fp32 loop sums otherwise)
      ref = nn::RMSNorm(w, 1e-5).forward(x);
      std::tie(ref_sum, ref_add) = nn::RMSNorm(w, 1e-5).forward_add(x, r);
    }
    LeanGradSwitch on(true);
    const at::Tensor xg = x.clone().requires_grad_(true);
    const at::Tensor y = nn::RMSNorm(w, 1e-5).forward(xg);
    ASSERT_NE(y.grad_fn(), nullptr);
    EXPECT_NE(y.grad_fn()->name().find("RmsNormFn"), std::string::npos) << y.grad_fn()->name();
    EXPECT_TRUE(at::equal(y.detach(), ref)) << c10::toString(dt);
    auto [s, y2] = nn::RMSNorm(w, 1e-5).forward_add(xg, r);
    EXPECT_TRUE(at::equal(s.detach(), ref_sum)) << c10::toString(dt);
    EXPECT_TRUE(at::equal(y2.detach(), ref_add)) << c10::toString(dt);
  }
}

TEST(LeanGrad, RmsNormGradientsAreTheReferenceAutogradsFp32) {
  at::manual_seed(12);
  // 3·700 rows of 4096: backward chunks of 1024, 1024 and 52 rows.
  for (int64_t C : {96, 4096}) {
    const int64_t rows = C == 96 ? 50 : 700;
    const at::Tensor x = lean_grad_rows({3, rows, C}, at::kFloat), w = 1 + 0.3 * at::randn({C});
    const at::Tensor gy = at::randn({3, rows, C});
    for (bool train_w : {false, true}) {
      if (C == 4096 && !train_w) continue;  // the large case once (its reference autograd is slow here)
      const LeanGradGrads ref = lean_grad_norm_run(false, x, w, gy, train_w);
      const LeanGradGrads lean = lean_grad_norm_run(true, x, w, gy, train_w);
      EXPECT_TRUE(at::equal(lean.y, ref.y));
      // Per row: dx ∝ rstd, so compare each row relative to its own largest gradient.
      const at::Tensor row_max = ref.dx.abs().amax(-1, true).clamp_min(1e-30);
      EXPECT_LT(((lean.dx - ref.dx).abs() / row_max).max().item<double>(), 2e-6) << "C " << C;
      if (train_w) EXPECT_LT(lean_grad_rel(lean.dw, ref.dw), 1e-5) << "C " << C;
      else EXPECT_FALSE(lean.dw.defined());
    }
  }
}

TEST(LeanGrad, RmsNormGradientsAreTheReferenceAutogradsBf16) {
  at::manual_seed(13);
  const int64_t C = 512;
  const at::Tensor x = lean_grad_rows({2, 300, C}, at::kBFloat16);
  const at::Tensor w = (1 + 0.3 * at::randn({C})).to(at::kBFloat16), gy = at::randn({2, 300, C}).to(at::kBFloat16);
  const LeanGradGrads ref = lean_grad_norm_run(false, x, w, gy, true);
  const LeanGradGrads lean = lean_grad_norm_run(true, x, w, gy, true);
  EXPECT_TRUE(at::equal(lean.y, ref.y));
  ASSERT_EQ(lean.dx.scalar_type(), at::kBFloat16);
  ASSERT_EQ(lean.dw.scalar_type(), at::kBFloat16);
  // The same fp32 values up to fp32 rounding, then one rounding to bf16: at most one bf16 step
  // apart, and nearly all equal.
  EXPECT_LE(lean_grad_bf16_ulps(lean.dx, ref.dx), 1.0);
  EXPECT_GT(lean.dx.eq(ref.dx).to(at::kDouble).mean().item<double>(), 0.98);
  EXPECT_LE(lean_grad_bf16_ulps(lean.dw, ref.dw), 1.0);
}

// The graph of the lean norm keeps x itself and rstd; the reference's keeps an fp32 copy of x.
TEST(LeanGrad, RmsNormGraphKeepsNoFp32Copy) {
  at::manual_seed(14);
  const int64_t N = 4096, C = 1024;  // bf16 x: 8 MiB; its fp32 copy: 16 MiB
  const at::Tensor x = lean_grad_rows({N, C}, at::kBFloat16).requires_grad_(true);
  const at::Tensor w = at::ones({C}, at::kBFloat16);
  auto kept = [&](bool lean) {
    LeanGradSwitch sw(lean);
    const int64_t before = compat::active_memory_bytes(at::kCPU);
    at::Tensor y = nn::RMSNorm(w, 1e-5).forward(x);
    return compat::active_memory_bytes(at::kCPU) - before - y.numel() * y.element_size();
  };
  const int64_t ref = kept(false), lean = kept(true);
  std::printf("[lean_grad] graph of one norm besides its output: reference %.1f MiB, lean %.1f MiB\n",
              ref / 1048576.0, lean / 1048576.0);
  EXPECT_GT(ref, 15 * 1048576);  // the fp32 copy
  EXPECT_LT(lean, 1 * 1048576);  // rstd: 16 KiB
}

TEST(LeanGrad, RotaryForwardAndBackwardAreTheReferenceBitForBit) {
  at::manual_seed(15);
  nn::RotaryEmbedding rope(nn::RopeParams{}, 64, 4096, at::kCPU);
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    auto [cos, sin] = rope.cos_sin(100, 33, dt);  // [T, D]
    // q as the attention makes it: [B, T, H, D] projections seen as [B, H, T, D] (strided).
    const at::Tensor q = (at::randn({2, 33, 4, 64}) * 3).to(dt).transpose(1, 2);
    const at::Tensor g = at::randn({2, 4, 33, 64}).to(dt);
    at::Tensor ref_nograd;
    {
      c10::NoGradGuard no_grad;
      ref_nograd = nn::apply_rotary(q, cos, sin);
    }
    at::Tensor y[2], dx[2];
    for (int lean = 0; lean < 2; ++lean) {
      LeanGradSwitch sw(lean == 1);
      at::Tensor x = q.detach().requires_grad_(true);
      y[lean] = nn::apply_rotary(x, cos, sin);
      y[lean].backward(g);
      dx[lean] = x.grad();
      if (lean == 1) {
        EXPECT_NE(y[1].grad_fn()->name().find("RotaryFn"), std::string::npos) << y[1].grad_fn()->name();
      }
    }
    EXPECT_TRUE(at::equal(y[1].detach(), y[0].detach())) << c10::toString(dt);
    EXPECT_TRUE(at::equal(y[1].detach(), ref_nograd)) << c10::toString(dt);
    EXPECT_EQ(y[1].strides(), ref_nograd.strides());  // downstream kernels see the same layout
    EXPECT_TRUE(at::equal(dx[1], dx[0])) << c10::toString(dt);
    EXPECT_GT(dx[1].abs().sum().item<double>(), 0);
  }
}

TEST(LeanGrad, RotaryPartialAndPerRowTables) {
  at::manual_seed(16);
  // Partial rotary (the first 16 of 64 dims rotate) and per-row tables [B, 1, 1, rot] (decode rows).
  const at::Tensor x0 = at::randn({3, 2, 5, 64}, at::kBFloat16);
  const at::Tensor cos_rows = at::rand({3, 1, 1, 16}).to(at::kBFloat16), sin_rows = at::rand({3, 1, 1, 16}).to(at::kBFloat16);
  const at::Tensor cos_full = at::rand({5, 64}).to(at::kBFloat16), sin_full = at::rand({5, 64}).to(at::kBFloat16);
  const at::Tensor g = at::randn({3, 2, 5, 64}, at::kBFloat16);
  for (int partial = 0; partial < 2; ++partial) {
    const at::Tensor& c = partial ? cos_rows : cos_full;
    const at::Tensor& s = partial ? sin_rows : sin_full;
    at::Tensor y[2], dx[2];
    for (int lean = 0; lean < 2; ++lean) {
      LeanGradSwitch sw(lean == 1);
      at::Tensor x = x0.clone().requires_grad_(true);
      y[lean] = nn::apply_rotary(x, c, s);
      y[lean].backward(g);
      dx[lean] = x.grad();
    }
    EXPECT_TRUE(at::equal(y[1].detach(), y[0].detach())) << "partial " << partial;
    EXPECT_TRUE(at::equal(dx[1], dx[0])) << "partial " << partial;
  }
  // Tables that would broadcast x to a larger shape, mixed dtypes, or a table needing grad: not lean.
  LeanGradSwitch on(true);
  const at::Tensor xr = x0.narrow(0, 0, 1).clone().requires_grad_(true);
  EXPECT_FALSE(nn::rotary_lean_applies(xr, cos_rows.expand({3, 1, 1, 16}).repeat({1, 1, 1, 4}), sin_full));
  EXPECT_FALSE(nn::rotary_lean_applies(xr, cos_full.to(at::kFloat), sin_full.to(at::kFloat)));
  EXPECT_FALSE(nn::rotary_lean_applies(xr, cos_full.clone().requires_grad_(true), sin_full));
  EXPECT_TRUE(nn::rotary_lean_applies(xr, cos_full, sin_full));
  c10::NoGradGuard no_grad;
  EXPECT_FALSE(nn::rotary_lean_applies(xr, cos_full, sin_full));  // inference never takes it
}

TEST(LeanGrad, SdpaGqaFlagNeedsTorch25) {
  const at::Tensor q = at::zeros({1, 4, 2, 8}), kv = at::zeros({1, 2, 2, 8});
  if (compat::kHasSdpaGqa) {
    const at::Tensor out = compat::sdpa(q, kv, kv, c10::nullopt, true, 1.0, true);
    EXPECT_EQ(out.sizes(), q.sizes());
  } else {
    EXPECT_THROW(compat::sdpa(q, kv, kv, c10::nullopt, true, 1.0, true), hearth::Error);
  }
}

// CUDA, PyTorch >= 2.5: with grad, nn::attention takes SDPA's enable_gqa (no repeated copies);
// its output, dk and dv equal the repeat_kv path's bit for bit, dq within the atomics' reordering.
TEST(LeanGrad, CudaSdpaGqaTrainingPathIsTheRepeatPath) {
  if (!compat::cuda_available() || !compat::kHasSdpaGqa) GTEST_SKIP() << "needs CUDA and PyTorch >= 2.5";
  at::manual_seed(17);
  const auto opt = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA, 0);
  const at::Tensor q0 = at::randn({2, 8, 300, 64}, opt), k0 = at::randn({2, 2, 300, 64}, opt),
                   v0 = at::randn({2, 2, 300, 64}, opt), g = at::randn({2, 8, 300, 64}, opt);
  nn::AttentionParams p;
  p.scale = 0.125;
  at::Tensor out[2], dq[2], dk[2], dv[2];
  for (int lean = 0; lean < 2; ++lean) {
    LeanGradSwitch sw(lean == 1);
    at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true), v = v0.clone().requires_grad_(true);
    out[lean] = nn::attention(q, k, v, p);
    out[lean].backward(g);
    dq[lean] = q.grad(), dk[lean] = k.grad(), dv[lean] = v.grad();
  }
  c10::NoGradGuard no_grad;
  {
    // The forward without a graph as training runs it (reference ops: SDPA keeps its cuDNN kernel,
    // the recomputation's), then as inference runs it (cuDNN left out: another kernel's rounding).
    const nn::FusedDecodeOff reference_ops;
    EXPECT_TRUE(at::equal(out[1].detach(), nn::attention(q0, k0, v0, p)));
  }
  EXPECT_LT(lean_grad_rel(nn::attention(q0, k0, v0, p), out[1].detach()), 1e-2);
  EXPECT_TRUE(at::equal(out[1].detach(), out[0].detach()));
  EXPECT_TRUE(at::equal(dk[1], dk[0]));
  EXPECT_TRUE(at::equal(dv[1], dv[0]));
  EXPECT_LT(lean_grad_rel(dq[1], dq[0]), 1e-2);
}
