// The gated delta rule's CUDA kernels (kernels/gated_delta.cu) through their dispatch in
// nn/gated_delta.h, against the tensor ops they replace on the same device (the fused path
// switched off): the chunked rule (its inter-chunk scan is the kernel) at the real Qwen3.5-0.8B
// shape and at odd ones (T not a multiple of 64, Hv = 2·Hk, Dk < 128, Dv not a multiple of the
// column slice, B = 2, with and without an initial state), and the fused one-token step (conv
// update, SiLU, l2norms, β, g, delta rule) over several steps in float32 and bfloat16, in place and
// not; then a Qwen3.5 model's graph decode with the kernels on against off. On the CPU: the
// scan's reference loop composes over chunks, shape errors are one-line hearth::Errors, and the
// fused step declines (the model runs the tensor ops). The CUDA tests skip without a GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "core/torch_compat.h"
#include "generate/generate.h"
#include "models/registry.h"
#include "nn/fused_ops.h"
#include "nn/gated_delta.h"
#include "test_paths.h"
#include "../test_util.h"

namespace {

using hearth::nn::GatedDeltaOut;
using hearth::nn::GatedDeltaStep;

// Restores the fused switch and cuDNN's TF32 setting at the end of a test. TF32 off: the
// reference's float32 conv1d (cuDNN) must not round its inputs to 10 mantissa bits.
struct GdkSwitch {
  bool was_fused, was_tf32;
  explicit GdkSwitch(bool on)
      : was_fused(hearth::nn::set_fused_decode(on)), was_tf32(at::globalContext().allowTF32CuDNN()) {
    at::globalContext().setAllowTF32CuDNN(false);
  }
  ~GdkSwitch() {
    hearth::nn::set_fused_decode(was_fused);
    at::globalContext().setAllowTF32CuDNN(was_tf32);
  }
};

double gdk_maxabs(const at::Tensor& t) { return t.to(at::kDouble).abs().max().item<double>(); }
double gdk_maxdiff(const at::Tensor& a, const at::Tensor& b) { return gdk_maxabs(a.to(at::kDouble) - b.to(at::kDouble)); }

struct GdkShape {
  int64_t B, T, Hk, Hv, Dk, Dv;
};

struct GdkInputs {
  at::Tensor q, k, v, g, beta, s0;
};

GdkInputs gdk_inputs(const GdkShape& s, at::ScalarType dt, at::Device dev, uint64_t seed) {
  at::manual_seed(seed);
  const auto o = at::TensorOptions().dtype(at::kFloat);
  GdkInputs in;
  in.q = at::randn({s.B, s.T, s.Hk, s.Dk}, o).to(dev, dt);
  in.k = at::randn({s.B, s.T, s.Hk, s.Dk}, o).to(dev, dt);
  in.v = at::randn({s.B, s.T, s.Hv, s.Dv}, o).to(dev, dt);
  in.g = (-at::rand({s.B, s.T, s.Hv}, o) * 0.5).to(dev);  // log decay <= 0, as the model's float32 g
  in.beta = at::rand({s.B, s.T, s.Hv}, o).to(dev, dt);
  in.s0 = (at::randn({s.B, s.Hv, s.Dk, s.Dv}, o) * 0.3).to(dev);
  return in;
}

// The one-token step as the model's tensor ops (models/qwen3_5/qwen3_5.cpp, transformers'
// Qwen3_5GatedDeltaNet with a cache and one token): conv update, split, β, g, recurrent rule.
GatedDeltaStep gdk_step_ops(const at::Tensor& mixed_qkv, const at::Tensor& w, const at::Tensor& conv_state,
                            const at::Tensor& a, const at::Tensor& b, const at::Tensor& A_log, const at::Tensor& dt_bias,
                            const at::Tensor& state, int64_t Hk, int64_t Dk, int64_t Dv) {
  const int64_t B = mixed_qkv.size(0), kd = Hk * Dk, vd = state.size(1) * Dv;
  auto [conv_out, new_conv] = hearth::nn::causal_conv1d(mixed_qkv.transpose(1, 2), w, conv_state);
  at::Tensor m = conv_out.transpose(1, 2);
  at::Tensor query = m.narrow(-1, 0, kd).reshape({B, 1, -1, Dk});
  at::Tensor key = m.narrow(-1, kd, kd).reshape({B, 1, -1, Dk});
  at::Tensor value = m.narrow(-1, 2 * kd, vd).reshape({B, 1, -1, Dv});
  at::Tensor beta = b.sigmoid();
  at::Tensor g = -A_log.to(at::kFloat).exp() * at::softplus(a.to(at::kFloat) + dt_bias);
  GatedDeltaOut r = hearth::nn::recurrent_gated_delta_rule(query, key, value, g, beta, state);
  return {r.out, new_conv, r.state};
}

}  // namespace

TEST(GatedDeltaKernels, CpuScanComposesOverChunksAndChecksShapes) {
  // Three chunks of 8 in one scan == one chunk, then two more from its state (the loop's carry).
  at::manual_seed(11);
  const int64_t B = 2, H = 3, N = 3, cs = 8, Dk = 4, Dv = 5;
  const at::Tensor nv = at::randn({B, H, N, cs, Dv}), kcd = at::randn({B, H, N, cs, Dk}) * 0.2;
  const at::Tensor q = at::randn({B, H, N, cs, Dk}), k = at::randn({B, H, N, cs, Dk}) * 0.2;
  const at::Tensor intra = at::randn({B, H, N, cs, cs}).tril(), decay = at::rand({B, H, N});
  const at::Tensor s0 = at::randn({B, H, Dk, Dv});
  GatedDeltaOut whole = hearth::nn::chunk_gated_delta_scan(nv, kcd, q, intra, k, decay, s0);
  ASSERT_EQ(whole.out.sizes(), (std::vector<int64_t>{B, H, N * cs, Dv}));
  ASSERT_EQ(whole.state.sizes(), s0.sizes());
  auto part = [](const at::Tensor& t, int64_t a, int64_t n) { return t.narrow(2, a, n); };
  GatedDeltaOut p1 = hearth::nn::chunk_gated_delta_scan(part(nv, 0, 1), part(kcd, 0, 1), part(q, 0, 1),
                                                        part(intra, 0, 1), part(k, 0, 1), part(decay, 0, 1), s0);
  GatedDeltaOut p2 = hearth::nn::chunk_gated_delta_scan(part(nv, 1, 2), part(kcd, 1, 2), part(q, 1, 2),
                                                        part(intra, 1, 2), part(k, 1, 2), part(decay, 1, 2), p1.state);
  EXPECT_LT(gdk_maxdiff(at::cat({p1.out, p2.out}, 2), whole.out), 1e-5);
  EXPECT_LT(gdk_maxdiff(p2.state, whole.state), 1e-5);
  // The first chunk by hand: v_new = nv − kcd·S; out = q·S + intra·v_new; S' = S·decay + kᵀ·v_new.
  const at::Tensor vn0 = nv.select(2, 0) - at::matmul(kcd.select(2, 0), s0);
  EXPECT_LT(gdk_maxdiff(p1.out, (at::matmul(q.select(2, 0), s0) + at::matmul(intra.select(2, 0), vn0))),
            1e-5);
  EXPECT_LT(gdk_maxdiff(p1.state, s0 * decay.select(2, 0).view({B, H, 1, 1}) +
                                      at::matmul(k.select(2, 0).transpose(-1, -2), vn0)),
            1e-5);
  const std::string err = hearth::testing::error_of(
      [&] { hearth::nn::chunk_gated_delta_scan(nv, kcd, q, intra, k, decay, at::randn({B, H, Dk + 1, Dv})); });
  EXPECT_NE(err.find("chunk_gated_delta_scan: state must be"), std::string::npos) << err;
  EXPECT_THROW(hearth::nn::chunk_gated_delta_scan(nv, kcd, q, intra.narrow(4, 0, cs - 1), k, decay, s0),
               hearth::Error);
  EXPECT_THROW(hearth::nn::chunk_gated_delta_scan(nv, kcd, q, intra, k, decay.narrow(2, 0, 2), s0), hearth::Error);
}

TEST(GatedDeltaKernels, CpuStepDeclinesSoTheModelRunsTheOps) {
  GdkSwitch on(true);
  const int64_t B = 1, Hk = 1, Hv = 2, Dk = 4, Dv = 4, K = 4, C = 2 * Hk * Dk + Hv * Dv;
  GatedDeltaStep s = hearth::nn::fused_gated_delta_step(
      at::randn({B, 1, C}), at::randn({C, K}), at::randn({B, C, K - 1}), at::randn({B, 1, Hv}), at::randn({B, 1, Hv}),
      at::randn({Hv}), at::randn({Hv}), at::randn({B, Hv, Dk, Dv}), Hk, Dk, Dv, true);
  EXPECT_FALSE(s.out.defined());
}

TEST(GatedDeltaKernels, CudaChunkRuleMatchesTheTensorOps) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
#ifndef HEARTH_WITH_CUDA_KERNELS
  GTEST_SKIP() << "built without Hearth's CUDA kernels";
#endif
  const at::Device cuda(at::kCUDA, 0);
  GdkSwitch sw(true);
  const std::vector<GdkShape> shapes = {
      {1, 1000, 16, 16, 128, 128},  // Qwen3.5-0.8B's linear layers, 16 chunks (the last partial): 16-column slices
      {2, 200, 16, 16, 128, 128},   // B = 2: 32-column slices
      {2, 150, 2, 4, 16, 24},       // Hv = 2·Hk, Dk padded to 64, Dv not a multiple of the slice (8 columns)
      {1, 64, 1, 3, 96, 130},       // exactly one chunk, Dk < 128 on the 128 tiling, Dv past a slice
      {1, 5, 2, 2, 128, 128},       // a short prompt: one mostly padded chunk
  };
  for (const GdkShape& s : shapes)
    for (bool with_state : {false, true})
      for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
        SCOPED_TRACE(::testing::Message() << "B " << s.B << " T " << s.T << " Hk " << s.Hk << " Hv " << s.Hv << " Dk "
                                          << s.Dk << " Dv " << s.Dv << " state " << with_state << " " << dt);
        const GdkInputs in = gdk_inputs(s, dt, cuda, 7 + s.T);
        const at::Tensor s0 = with_state ? in.s0 : at::Tensor();
        hearth::nn::set_fused_decode(false);
        const GatedDeltaOut want = hearth::nn::chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, s0);
        hearth::nn::set_fused_decode(true);
        const GatedDeltaOut got = hearth::nn::chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, s0);
        ASSERT_EQ(got.out.sizes(), want.out.sizes());
        ASSERT_EQ(got.out.scalar_type(), dt);
        ASSERT_EQ(got.state.sizes(), (std::vector<int64_t>{s.B, s.Hv, s.Dk, s.Dv}));
        ASSERT_EQ(got.state.scalar_type(), at::kFloat);
        // The same float32 arithmetic summed in another order (the kernel's FMA chains vs cuBLAS):
        // ~1e-6 relative per product, grown over Dk + 64 terms per output and the state carried
        // across chunks — measured well under 1e-5 of the largest value; an indexing or
        // synchronisation slip shows as O(1). bfloat16 outputs are compared after their rounding
        // (both sides round the same float32 values; one ulp where those straddle a boundary).
        const double scale = std::max(1.0, gdk_maxabs(want.out.to(at::kFloat)));
        const double state_scale = std::max(1.0, gdk_maxabs(want.state));
        const double out_tol = dt == at::kFloat ? 1e-4 * scale : scale / 128;
        const double dout = gdk_maxdiff(got.out, want.out), dstate = gdk_maxdiff(got.state, want.state);
        std::cout << "[gated-delta scan] B " << s.B << " T " << s.T << " Dk " << s.Dk << " Dv " << s.Dv << " "
                  << c10::toString(dt) << " state " << with_state << ": max|dout| " << dout << " (of " << scale
                  << "), max|dstate| " << dstate << " (of " << state_scale << ")\n";
        EXPECT_LE(dout, out_tol);
        EXPECT_LE(dstate, 1e-4 * state_scale);
      }
  // Autograd recording keeps the tensor ops (the kernel has no backward).
  const GdkInputs in = gdk_inputs({1, 70, 1, 1, 16, 16}, at::kFloat, cuda, 3);
  at::Tensor qg = in.q.clone().requires_grad_(true);
  const GatedDeltaOut r = hearth::nn::chunk_gated_delta_rule(qg, in.k, in.v, in.g, in.beta, in.s0);
  EXPECT_TRUE(r.out.requires_grad());
}

TEST(GatedDeltaKernels, CudaDecodeStepMatchesTheTensorOps) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
#ifndef HEARTH_WITH_CUDA_KERNELS
  GTEST_SKIP() << "built without Hearth's CUDA kernels";
#endif
  const at::Device cuda(at::kCUDA, 0);
  GdkSwitch sw(true);
  struct Case {
    int64_t B, Hk, Hv, Dk, Dv, K;
    at::ScalarType dt, dt_bias_dt;
    bool in_place;
  };
  const std::vector<Case> cases = {
      {1, 16, 16, 128, 128, 4, at::kBFloat16, at::kBFloat16, true},  // Qwen3.5-0.8B, a static cache
      {1, 16, 16, 128, 128, 4, at::kFloat, at::kFloat, false},
      {2, 2, 4, 16, 24, 4, at::kBFloat16, at::kFloat, true},  // Hv = 2·Hk, Dv < 32, float32 dt_bias
      {3, 1, 2, 256, 40, 3, at::kFloat, at::kFloat, false},   // Dk = 256 (32 rows a thread), K = 3
      {1, 2, 2, 96, 130, 4, at::kHalf, at::kHalf, true},      // Dk not a multiple of 8·16, Dv past 4 slices
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "B " << c.B << " Hk " << c.Hk << " Hv " << c.Hv << " Dk " << c.Dk << " Dv "
                                      << c.Dv << " K " << c.K << " " << c.dt << " in_place " << c.in_place);
    at::manual_seed(c.B * 100 + c.Dk);
    const int64_t C = 2 * c.Hk * c.Dk + c.Hv * c.Dv;
    const auto f = at::TensorOptions().dtype(at::kFloat);
    const at::Tensor w = (at::randn({C, c.K}, f) * 0.5).to(cuda, c.dt);
    const at::Tensor A_log = at::log(at::rand({c.Hv}, f) * 15 + 1).to(cuda);
    const at::Tensor dt_bias = (at::randn({c.Hv}, f) * 0.5).to(cuda, c.dt_bias_dt);
    at::Tensor conv_ref = at::randn({c.B, C, c.K - 1}, f).to(cuda, c.dt), conv_got = conv_ref.clone();
    at::Tensor state_ref = (at::randn({c.B, c.Hv, c.Dk, c.Dv}, f) * 0.3).to(cuda), state_got = state_ref.clone();
    for (int step = 0; step < 3; ++step) {
      // Projection outputs as views into wider rows (batch stride != width), as forward_many gives.
      const at::Tensor wide = at::randn({c.B, 1, C + 2 * c.Hv + 3}, f).to(cuda, c.dt);
      const at::Tensor mixed = wide.narrow(2, 0, C), b = wide.narrow(2, C, c.Hv), a = wide.narrow(2, C + c.Hv, c.Hv);
      const GatedDeltaStep want = gdk_step_ops(mixed, w, conv_ref, a, b, A_log, dt_bias, state_ref, c.Hk, c.Dk, c.Dv);
      const at::Tensor state_before = state_got;
      const GatedDeltaStep got = hearth::nn::fused_gated_delta_step(mixed, w, conv_got, a, b, A_log, dt_bias, state_got,
                                                                    c.Hk, c.Dk, c.Dv, c.in_place);
      ASSERT_TRUE(got.out.defined()) << "the kernel declined";
      ASSERT_EQ(got.out.sizes(), want.out.sizes());
      ASSERT_EQ(got.out.scalar_type(), c.dt);
      EXPECT_TRUE(at::equal(got.conv_state, want.conv_state)) << "the window shift is a copy";
      EXPECT_EQ(got.state.data_ptr() == state_before.data_ptr(), c.in_place);
      // float32: the same values summed in another order (~1e-6). 16-bit: the conv and silu
      // outputs are rounded to the dtype on both sides, and a float32 sum in another order can
      // land one ulp (2^-8 bf16, 2^-11 fp16) away on a few of them; out carries one more rounding.
      const double ulp = c.dt == at::kBFloat16 ? 1.0 / 128 : c.dt == at::kHalf ? 1.0 / 1024 : 1e-5;
      const double scale = std::max(1.0, gdk_maxabs(want.out.to(at::kFloat)));
      const double state_scale = std::max(1.0, gdk_maxabs(want.state));
      const double dout = gdk_maxdiff(got.out, want.out), dstate = gdk_maxdiff(got.state, want.state);
      std::cout << "[gated-delta step] B " << c.B << " Dk " << c.Dk << " Dv " << c.Dv << " " << c10::toString(c.dt)
                << " step " << step << ": max|dout| " << dout << " (of " << scale << "), max|dstate| " << dstate
                << " (of " << state_scale << ")\n";
      EXPECT_LE(dout, ulp * scale) << "step " << step;
      EXPECT_LE(dstate, ulp * state_scale) << "step " << step;
      conv_ref = want.conv_state, state_ref = want.state;
      conv_got = got.conv_state, state_got = got.state;
    }
  }
  // Autograd recording or another layout: the kernel declines (the caller runs the ops).
  const at::Tensor x = at::randn({1, 1, 2 * 4 + 8}, at::TensorOptions().device(cuda));
  const at::Tensor ab = at::randn({1, 1, 2}, at::TensorOptions().device(cuda));
  const at::Tensor st = at::zeros({1, 2, 4, 4}, at::TensorOptions().device(cuda));
  auto step = [&](const at::Tensor& xx, const at::Tensor& state) {
    return hearth::nn::fused_gated_delta_step(xx, at::randn({16, 4}, x.options()), at::randn({1, 16, 3}, x.options()),
                                              ab, ab, at::zeros({2}, x.options()), at::zeros({2}, x.options()), state, 1,
                                              4, 4, false);
  };
  EXPECT_TRUE(step(x, st).out.defined());
  EXPECT_FALSE(step(x.clone().requires_grad_(true), st).out.defined());
  EXPECT_FALSE(step(x, st.transpose(2, 3)).out.defined());
  hearth::nn::set_fused_decode(false);
  EXPECT_FALSE(step(x, st).out.defined());
}

TEST(GatedDeltaKernels, CudaQwen35GraphDecodeMatchesTheTensorOps) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
#ifndef HEARTH_WITH_CUDA_KERNELS
  GTEST_SKIP() << "built without Hearth's CUDA kernels";
#endif
  // A 150-token prompt (chunked prefill: the scan kernel over 3 chunks) and 48 captured decode
  // steps (the fused step writing the static cache in place), kernels on vs off, float32.
  const auto dir = std::filesystem::path(HEARTH_SOURCE_DIR) / "tests/golden/models/qwen3_5/q35_tied_hv2";
  auto model = hearth::models::load_model(dir, {at::kCUDA, at::kFloat});
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < 150; ++i) prompt.push_back((i * 13 + 7) % 97 + 2);
  auto run = [&](bool fused) {
    GdkSwitch sw(fused);
    setenv("HEARTH_CUDA_GRAPHS", "1", 1);
    hearth::generate::GenerateOptions o;
    o.max_tokens = 48;
    o.logprobs = true;
    std::vector<at::Tensor> lps;
    hearth::generate::GenerationResult r =
        hearth::generate::generate(*model, prompt, o, [&](int64_t, const hearth::generate::StepLogprobs* lp) {
          lps.push_back(lp ? lp->all.to(at::kCPU).clone() : at::Tensor());
          return true;
        });
    unsetenv("HEARTH_CUDA_GRAPHS");
    EXPECT_TRUE(r.stats.static_decode);
    std::cout << "[gated-delta model] fused " << fused << ": cuda graph " << r.stats.cuda_graph << "\n";
    return std::make_pair(r.tokens, lps);
  };
  const auto [want_tokens, want_lp] = run(false);
  const auto [got_tokens, got_lp] = run(true);
  EXPECT_EQ(got_tokens, want_tokens);
  ASSERT_EQ(got_lp.size(), want_lp.size());
  double worst = 0;
  for (size_t t = 0; t < got_lp.size(); ++t) worst = std::max(worst, gdk_maxdiff(got_lp[t], want_lp[t]));
  std::cout << "[gated-delta model] q35_tied_hv2 fp32 graph decode, kernels on vs off: max|dlogprob| " << worst << "\n";
  // float32 summation order, amplified by these random models' large logits (the same 5e-4 the
  // static step keeps to the eager loop, tests/generate/graph_decode_hybrid_test.cpp).
  EXPECT_LE(worst, 5e-4);
}
