// The lean norms of the Gemma 4 and Qwen3.5 families (nn::rms_norm_lean_fp32w,
// nn::rms_norm_gated_lean) against the modules' reference ops, on the CPU in fp32 and bf16 with
// real values: Gemma4RMSNorm (weight, no weight: v_norm; forward and forward_add),
// ZeroCenteredRMSNorm (offset 1 and 0) and RMSNormGated. With grad and the lean path on the modules
// run the lean Functions (grad_fn names) and give the no-grad reference output bit for bit; the
// gradients of x, weight (and gate) equal autograd of the reference ops (lean path off) within
// fp32 rounding (bf16: within one bf16 step, nearly all equal; the gate's gradient bit for bit);
// the graphs keep no fp32 copies of their inputs.
#include <gtest/gtest.h>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>

#include <cstdio>
#include <functional>
#include <string>

#include "core/error.h"
#include "core/torch_compat.h"
#include "models/gemma4/gemma4.h"
#include "models/qwen3_5/qwen3_5.h"
#include "nn/lean_grad.h"

namespace {

namespace nn = hearth::nn;
namespace compat = hearth::compat;
using hearth::models::gemma4::Gemma4RMSNorm;
using hearth::models::qwen3_5::RMSNormGated;
using hearth::models::qwen3_5::ZeroCenteredRMSNorm;

struct LeanNormsSwitch {
  bool was;
  explicit LeanNormsSwitch(bool on) : was(nn::set_lean_grad(on)) {}
  ~LeanNormsSwitch() { nn::set_lean_grad(was); }
};

// One norm under test: y = f(x, w, gate) (w or gate may be unused), the lean Function's name.
struct LeanNormsCase {
  std::string name, fn;
  bool has_w = true, has_gate = false;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)> f;
};

std::vector<LeanNormsCase> lean_norms_cases() {
  const double eps = 1e-6;
  return {
      {"gemma4 weight", "RmsNormFp32wFn", true, false,
       [=](const at::Tensor& x, const at::Tensor& w, const at::Tensor&) { return Gemma4RMSNorm{w, eps}.forward(x); }},
      {"gemma4 no weight", "RmsNormFp32wFn", false, false,
       [=](const at::Tensor& x, const at::Tensor&, const at::Tensor&) {
         return Gemma4RMSNorm{std::nullopt, eps}.forward(x);
       }},
      {"qwen3_5 offset 1", "RmsNormFp32wFn", true, false,
       [=](const at::Tensor& x, const at::Tensor& w, const at::Tensor&) {
         return ZeroCenteredRMSNorm{w, eps, 1.0}.forward(x);
       }},
      {"qwen3_5 offset 0", "RmsNormFp32wFn", true, false,
       [=](const at::Tensor& x, const at::Tensor& w, const at::Tensor&) {
         return ZeroCenteredRMSNorm{w, eps, 0.0}.forward(x);
       }},
      {"qwen3_5 gated", "RmsNormGatedFn", true, true,
       [=](const at::Tensor& x, const at::Tensor& w, const at::Tensor& z) { return RMSNormGated{w, eps}.forward(x, z); }},
  };
}

// Rows of very different scales (1e-3 .. 1e2), so rstd and the fp32 rounding vary.
at::Tensor lean_norms_rows(std::vector<int64_t> shape, at::ScalarType dt) {
  at::Tensor x = at::randn(shape, at::kDouble);
  at::Tensor scale = at::pow(10.0, at::rand(std::vector<int64_t>(shape.begin(), shape.end() - 1), at::kDouble) * 5 - 3);
  return (x * scale.unsqueeze(-1)).to(dt);
}

struct LeanNormsGrads {
  at::Tensor y, dx, dw, dz;
  std::string fn;
};

// y = case(x, w, z) with grad (lean on or off), y.backward(gy): y, the gradients and grad_fn's name.
LeanNormsGrads lean_norms_run(const LeanNormsCase& c, bool lean, const at::Tensor& x0, const at::Tensor& w0,
                              const at::Tensor& z0, const at::Tensor& gy, bool train_w) {
  LeanNormsSwitch sw(lean);
  // A strided x (a view) is taken as it is: a clone would make it contiguous.
  at::Tensor x = (x0.is_contiguous() ? x0.clone() : x0.detach()).requires_grad_(true);
  at::Tensor w = c.has_w ? w0.clone().requires_grad_(train_w) : at::Tensor();
  at::Tensor z = c.has_gate ? z0.clone().requires_grad_(true) : at::Tensor();
  at::Tensor y = c.f(x, w, z);
  LeanNormsGrads r;
  r.fn = y.grad_fn()->name();
  y.backward(gy);
  r.y = y.detach();
  r.dx = x.grad();
  if (c.has_w && train_w) r.dw = w.grad();
  if (c.has_gate) r.dz = z.grad();
  return r;
}

double lean_norms_rel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return ((x - y).abs().max() / y.abs().max()).item<double>();
}

// Per row (dx ∝ rstd): max |a − b| over the row's largest |b|.
double lean_norms_row_rel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return ((x - y).abs() / y.abs().amax(-1, true).clamp_min(1e-30)).max().item<double>();
}

// Largest |a − b| in units of the bf16 spacing at |b|; 0 when equal.
double lean_norms_bf16_ulps(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  at::Tensor spacing = at::pow(2.0, at::floor(at::log2(y.abs().clamp_min(1e-30))) - 7);
  return ((x - y).abs() / spacing).max().item<double>();
}

}  // namespace

TEST(LeanGradNorms, ForwardIsTheModulesReferenceBitForBit) {
  at::manual_seed(21);
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = lean_norms_rows({3, 37, 96}, dt), z = (at::randn({3, 37, 96}) * 2).to(dt);
    const at::Tensor w = (0.2 * at::randn({96})).to(dt) + 1;
    for (const LeanNormsCase& c : lean_norms_cases()) {
      at::Tensor ref;
      {
        c10::NoGradGuard no_grad;
        ref = c.f(x, w, z);
      }
      LeanNormsSwitch on(true);
      const at::Tensor y = c.f(x.clone().requires_grad_(true), w, z);
      ASSERT_NE(y.grad_fn(), nullptr) << c.name;
      EXPECT_NE(y.grad_fn()->name().find(c.fn), std::string::npos) << c.name << ": " << y.grad_fn()->name();
      EXPECT_EQ(y.scalar_type(), dt);
      EXPECT_TRUE(at::equal(y.detach(), ref)) << c.name << " " << c10::toString(dt);
      // Only the weight (or only the gate) requiring grad also takes the lean Function.
      if (c.has_w) {
        const at::Tensor yw = c.f(x, w.clone().requires_grad_(true), z);
        EXPECT_NE(yw.grad_fn()->name().find(c.fn), std::string::npos) << c.name;
        EXPECT_TRUE(at::equal(yw.detach(), ref)) << c.name << " " << c10::toString(dt);
      }
    }
    // Gemma's sandwich norms: residual + norm(x).
    const at::Tensor r = lean_norms_rows({3, 37, 96}, dt);
    at::Tensor ref_add;
    {
      c10::NoGradGuard no_grad;
      ref_add = Gemma4RMSNorm{w, 1e-6}.forward_add(x, r);
    }
    LeanNormsSwitch on(true);
    const at::Tensor y_add = Gemma4RMSNorm{w, 1e-6}.forward_add(x.clone().requires_grad_(true), r);
    EXPECT_TRUE(at::equal(y_add.detach(), ref_add)) << c10::toString(dt);
  }
}

TEST(LeanGradNorms, OffWithoutGradOrSwitchedOff) {
  const at::Tensor x = at::randn({4, 8}).requires_grad_(true), w = at::ones({8});
  const Gemma4RMSNorm gemma{w, 1e-6};
  const ZeroCenteredRMSNorm qwen{w, 1e-6, 1.0};
  const RMSNormGated gated{w, 1e-6};
  {
    LeanNormsSwitch off(false);
    EXPECT_EQ(gemma.forward(x).grad_fn()->name().find("RmsNormFp32wFn"), std::string::npos);
    EXPECT_EQ(qwen.forward(x).grad_fn()->name().find("RmsNormFp32wFn"), std::string::npos);
    EXPECT_EQ(gated.forward(x, x).grad_fn()->name().find("RmsNormGatedFn"), std::string::npos);
  }
  LeanNormsSwitch on(true);
  EXPECT_THROW(nn::rms_norm_lean_fp32w(x, at::ones({7}), 1e-6), hearth::Error);
  EXPECT_THROW(nn::rms_norm_gated_lean(x, at::ones({4, 7}), w, 1e-6), hearth::Error);
  c10::NoGradGuard no_grad;
  EXPECT_EQ(gemma.forward(x).grad_fn(), nullptr);
  EXPECT_EQ(qwen.forward(x).grad_fn(), nullptr);
}

TEST(LeanGradNorms, GradientsAreTheReferenceAutogradsFp32) {
  at::manual_seed(22);
  for (const LeanNormsCase& c : lean_norms_cases()) {
    // C 96: one chunk; C 4096 (3·400 rows): backward chunks of 1024 and 176 rows.
    for (int64_t C : {96, 4096}) {
      const int64_t rows = C == 96 ? 50 : 400;
      const at::Tensor x = lean_norms_rows({3, rows, C}, at::kFloat), w = 1 + 0.3 * at::randn({C});
      const at::Tensor z = at::randn({3, rows, C}) * 2, gy = at::randn({3, rows, C});
      for (bool train_w : {false, true}) {
        if (C == 4096 && !train_w) continue;  // the large case once (its reference autograd is slow here)
        if (!c.has_w && train_w) continue;
        const LeanNormsGrads ref = lean_norms_run(c, false, x, w, z, gy, train_w);
        const LeanNormsGrads lean = lean_norms_run(c, true, x, w, z, gy, train_w);
        EXPECT_NE(lean.fn.find(c.fn), std::string::npos) << c.name << ": " << lean.fn;
        EXPECT_EQ(ref.fn.find(c.fn), std::string::npos) << c.name << ": " << ref.fn;
        const std::string tag = c.name + " C " + std::to_string(C) + (train_w ? " w" : "");
        EXPECT_TRUE(at::equal(lean.y, ref.y)) << tag;
        const double ex = lean_norms_row_rel(lean.dx, ref.dx);
        EXPECT_LT(ex, 2e-6) << tag;
        double ew = 0;
        if (train_w) {
          ew = lean_norms_rel(lean.dw, ref.dw);
          EXPECT_LT(ew, 2e-6) << tag;
        } else {
          EXPECT_FALSE(lean.dw.defined()) << tag;
        }
        if (c.has_gate) EXPECT_TRUE(at::equal(lean.dz, ref.dz)) << tag;
        std::printf("[lean_grad_norms] %s fp32: dx %.2e, dw %.2e relative\n", tag.c_str(), ex, ew);
      }
    }
  }
}

TEST(LeanGradNorms, GradientsAreTheReferenceAutogradsBf16) {
  at::manual_seed(23);
  const int64_t C = 512;
  const at::Tensor x = lean_norms_rows({2, 300, C}, at::kBFloat16);
  const at::Tensor w = (1 + 0.3 * at::randn({C})).to(at::kBFloat16), z = (at::randn({2, 300, C}) * 2).to(at::kBFloat16);
  const at::Tensor gy = at::randn({2, 300, C}).to(at::kBFloat16);
  for (const LeanNormsCase& c : lean_norms_cases()) {
    const LeanNormsGrads ref = lean_norms_run(c, false, x, w, z, gy, true);
    const LeanNormsGrads lean = lean_norms_run(c, true, x, w, z, gy, true);
    EXPECT_TRUE(at::equal(lean.y, ref.y)) << c.name;
    ASSERT_EQ(lean.dx.scalar_type(), at::kBFloat16);
    // The same fp32 values up to fp32 rounding, then one rounding to bf16: at most one bf16 step
    // apart, and nearly all equal.
    EXPECT_LE(lean_norms_bf16_ulps(lean.dx, ref.dx), 1.0) << c.name;
    const double same = lean.dx.eq(ref.dx).to(at::kDouble).mean().item<double>();
    EXPECT_GT(same, 0.98) << c.name;
    if (c.has_w) {
      ASSERT_EQ(lean.dw.scalar_type(), at::kBFloat16);
      EXPECT_LE(lean_norms_bf16_ulps(lean.dw, ref.dw), 1.0) << c.name;
    }
    if (c.has_gate) EXPECT_TRUE(at::equal(lean.dz, ref.dz)) << c.name;
    std::printf("[lean_grad_norms] %s bf16: dx equal %.4f, at most %.0f step\n", c.name.c_str(), same,
                lean_norms_bf16_ulps(lean.dx, ref.dx));
  }
}

// A non-contiguous input (Qwen3.5's q: a narrow of q_proj's output [.., 2D]) and a weight of
// another dtype than x (fp32 weight, bf16 x).
TEST(LeanGradNorms, StridedInputAndMixedDtypes) {
  at::manual_seed(24);
  const at::Tensor qg = lean_norms_rows({2, 9, 4, 64}, at::kFloat);
  const at::Tensor q = qg.narrow(-1, 0, 32), gy = at::randn({2, 9, 4, 32});
  ASSERT_FALSE(q.is_contiguous());
  const at::Tensor w = 0.1 * at::randn({32});
  const LeanNormsCase c = lean_norms_cases()[2];  // qwen3_5 offset 1
  const LeanNormsGrads ref = lean_norms_run(c, false, q, w, {}, gy, true);
  const LeanNormsGrads lean = lean_norms_run(c, true, q, w, {}, gy, true);
  EXPECT_TRUE(at::equal(lean.y, ref.y));
  EXPECT_LT(lean_norms_row_rel(lean.dx, ref.dx), 2e-6);
  EXPECT_LT(lean_norms_rel(lean.dw, ref.dw), 2e-6);
  const at::Tensor xb = lean_norms_rows({5, 48}, at::kBFloat16), gb = at::randn({5, 48}).to(at::kBFloat16);
  const at::Tensor wf = 1 + 0.3 * at::randn({48});
  for (size_t i : {size_t{0}, size_t{4}}) {  // gemma4 weight, qwen3_5 gated
    const LeanNormsCase& k = lean_norms_cases()[i];
    const at::Tensor zb = at::randn({5, 48}).to(at::kBFloat16);
    const LeanNormsGrads r0 = lean_norms_run(k, false, xb, wf, zb, gb, true);
    const LeanNormsGrads r1 = lean_norms_run(k, true, xb, wf, zb, gb, true);
    EXPECT_TRUE(at::equal(r1.y, r0.y)) << k.name;
    EXPECT_LE(lean_norms_bf16_ulps(r1.dx, r0.dx), 1.0) << k.name;
    ASSERT_EQ(r1.dw.scalar_type(), at::kFloat);
    EXPECT_LT(lean_norms_rel(r1.dw, r0.dw), 1e-5) << k.name;
  }
}

// The lean graphs keep their inputs and rstd; the references keep fp32 copies (the gated one also
// the fp32 gate, its silu and the weighted rows).
// fp64 inputs (the fp64 test models): the fp32-weight norms compute in fp32 as their modules do;
// the gated norm's a · silu and everything after it are fp64 (type promotion), and so are its
// gradients there: equal to the reference's within fp64 rounding after the fp32 parts.
TEST(LeanGradNorms, Fp64InputsFollowTheReferencesPromotion) {
  at::manual_seed(26);
  const at::Tensor x = lean_norms_rows({3, 40, 64}, at::kDouble), z = at::randn({3, 40, 64}, at::kDouble) * 2;
  const at::Tensor w = 1 + 0.3 * at::randn({64}, at::kDouble), gy = at::randn({3, 40, 64}, at::kDouble);
  for (const LeanNormsCase& c : lean_norms_cases()) {
    at::Tensor ref_nograd;
    {
      c10::NoGradGuard no_grad;
      ref_nograd = c.f(x, w, z);
    }
    const LeanNormsGrads ref = lean_norms_run(c, false, x, w, z, gy, c.has_w);
    const LeanNormsGrads lean = lean_norms_run(c, true, x, w, z, gy, c.has_w);
    EXPECT_NE(lean.fn.find(c.fn), std::string::npos) << c.name;
    EXPECT_TRUE(at::equal(lean.y, ref_nograd)) << c.name;
    EXPECT_TRUE(at::equal(lean.y, ref.y)) << c.name;
    const double ex = lean_norms_row_rel(lean.dx, ref.dx);
    EXPECT_LT(ex, 2e-6) << c.name;
    if (c.has_w) EXPECT_LT(lean_norms_rel(lean.dw, ref.dw), 2e-6) << c.name;
    // The gate's gradient: fp64 g · a rounded to fp32 as the reference does, then the same ops.
    if (c.has_gate) EXPECT_TRUE(at::equal(lean.dz, ref.dz)) << c.name;
    std::printf("[lean_grad_norms] %s fp64: dx %.2e relative\n", c.name.c_str(), ex);
  }
}

TEST(LeanGradNorms, GraphsKeepNoFp32Copies) {
  at::manual_seed(25);
  const int64_t N = 4096, C = 1024;  // bf16 x: 8 MiB; its fp32 copy: 16 MiB
  const at::Tensor x = lean_norms_rows({N, C}, at::kBFloat16).requires_grad_(true);
  const at::Tensor z = at::randn({N, C}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor w = at::ones({C}, at::kBFloat16);
  for (const LeanNormsCase& c : lean_norms_cases()) {
    auto kept = [&](bool lean) {
      LeanNormsSwitch sw(lean);
      const int64_t before = compat::active_memory_bytes(at::kCPU);
      at::Tensor y = c.f(x, w, z);
      return compat::active_memory_bytes(at::kCPU) - before - y.numel() * y.element_size();
    };
    const int64_t ref = kept(false), lean = kept(true);
    std::printf("[lean_grad_norms] graph of %s besides its output: reference %.1f MiB, lean %.1f MiB\n",
                c.name.c_str(), ref / 1048576.0, lean / 1048576.0);
    EXPECT_GT(ref, 15 * 1048576) << c.name;  // the fp32 copy
    EXPECT_LT(lean, 1 * 1048576) << c.name;  // rstd: 16 KiB
  }
}
