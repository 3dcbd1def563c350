// Tests for the decode GEMV (kernels/gemv.cu through nn/decode_gemv.h and Linear::forward_many)
// and the grouped-GQA decode attention (nn/attention.cpp): against fp64 / unfused references on
// the same device, and bit-equality where the design promises it (grouped = separate launches, a
// row's result independent of M). The CUDA cases are skipped on this CPU build; run on the GPU.
#include <gtest/gtest.h>

#include <cmath>

#include <c10/core/GradMode.h>

#include "core/torch_compat.h"
#include "nn/attention.h"
#include "nn/decode_gemv.h"
#include "cuda_kernel_test_util.h"
#include "nn/fused_ops.h"
#include "nn/linear.h"
#include "nn/quant.h"

TEST(DecodeGemv, NotAppliedOnCpuOrWhenSwitchedOff) {
  const at::Tensor x = at::randn({1, 64});
  const at::Tensor w = at::randn({32, 64});
  EXPECT_TRUE(hearth::nn::decode_gemv(x, {hearth::nn::GemvOperand{w, nullptr}}).empty());
  // forward_many falls back to each forward: the same tensors as Linear::forward.
  const hearth::nn::Linear a(w), b(at::randn({16, 64}));
  const std::vector<at::Tensor> ys = hearth::nn::Linear::forward_many(x, {&a, &b});
  ASSERT_EQ(ys.size(), 2u);
  EXPECT_TRUE(at::equal(ys[0], a.forward(x)));
  EXPECT_TRUE(at::equal(ys[1], b.forward(x)));
  EXPECT_EQ(ys[1].sizes().vec(), (std::vector<int64_t>{1, 16}));
}

TEST(DecodeGemv, DenseMatchesFp64ReferenceAndIsRowIndependent) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's kernels (GPU machine)";
  hearth::testing::FusedDecodeSwitch on(true);
  at::manual_seed(31);
  const at::Device cuda(at::kCUDA, 0);
  for (auto dt : {at::kBFloat16, at::kHalf, at::kFloat})
    for (auto [out, in] : {std::pair<int64_t, int64_t>{37, 64}, {1000, 1024}, {5, 8}, {2048, 8192}, {3000, 2048}})
      for (int64_t M : {1, 2, 3, 8}) {
        if (dt == at::kFloat && in % 4 != 0) continue;
        const at::Tensor w = (at::randn({out, in}) * 0.05).to(dt).to(cuda);
        const at::Tensor x = at::randn({M, in}).to(dt).to(cuda);
        const std::vector<at::Tensor> y = hearth::nn::decode_gemv(x, {hearth::nn::GemvOperand{w, nullptr}});
        ASSERT_EQ(y.size(), 1u) << "dtype " << dt << " [" << out << ", " << in << "] M " << M;
        ASSERT_EQ(y[0].scalar_type(), dt);
        ASSERT_EQ(y[0].sizes().vec(), (std::vector<int64_t>{M, out}));
        const at::Tensor ref = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
        EXPECT_LE(hearth::testing::max_rel_err(y[0], ref), hearth::testing::one_rounding_tol(dt)) << "dtype " << dt << " [" << out << ", " << in << "] M " << M;
        // Row m of an M-row call is the one-row call on row m, bit for bit.
        for (int64_t m = 0; m < M; ++m) {
          const at::Tensor one = hearth::nn::decode_gemv(x.narrow(0, m, 1).clone(), {hearth::nn::GemvOperand{w, nullptr}})[0];
          EXPECT_TRUE(at::equal(one[0], y[0][m])) << "row " << m << " of M " << M;
        }
      }
  // Nine rows, a weight that needs a gradient, or another dtype: not this kernel.
  const at::Tensor w = at::randn({64, 64}).to(cuda);
  EXPECT_TRUE(hearth::nn::decode_gemv(at::randn({9, 64}).to(cuda), {hearth::nn::GemvOperand{w, nullptr}}).empty());
  EXPECT_TRUE(hearth::nn::decode_gemv(at::randn({1, 64}).to(cuda).to(at::kHalf), {hearth::nn::GemvOperand{w, nullptr}}).empty());
  const at::Tensor wg = at::randn({64, 64}, at::TensorOptions().device(cuda)).requires_grad_(true);
  EXPECT_TRUE(hearth::nn::decode_gemv(at::randn({1, 64}).to(cuda), {hearth::nn::GemvOperand{wg, nullptr}}).empty());
}

TEST(DecodeGemv, AffineMatchesDequantizedReferenceAndIsRowIndependent) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's kernels (GPU machine)";
  hearth::testing::FusedDecodeSwitch on(true);
  at::manual_seed(36);
  const at::Device cuda(at::kCUDA, 0);
  // in = 32768 at 8 bits: an 8-row call's chunk sums (64 KB) exceed the shared-memory limit and are
  // added in the loop, a one-row call's (8 KB) come from shared memory — the same bits either way.
  // in = 96 at group 32: a 4-bit row of 3 chunks (fewer than the 4 lanes of a row; an odd count of
  // chunk sums before x in shared memory).
  for (int bits : {4, 8})
    for (auto [in, gs] : {std::pair<int64_t, int>{256, 64}, {4096, 64}, {32768, 64}, {96, 32}})
      for (auto dt : {at::kBFloat16, at::kFloat}) {
        hearth::nn::QuantizedWeight w = hearth::nn::quantize(at::randn({96, in}) * 0.05, hearth::nn::QuantSpec{bits, gs});
        w = hearth::nn::QuantizedWeight{w.wq.to(cuda), w.scales.to(dt).to(cuda), w.biases.to(dt).to(cuda), w.spec};
        for (int64_t M : {1, 3, 8}) {
          const at::Tensor x = at::randn({M, in}).to(dt).to(cuda);
          const std::vector<at::Tensor> y = hearth::nn::decode_gemv(x, {hearth::nn::GemvOperand{{}, &w}});
          ASSERT_EQ(y.size(), 1u) << bits << " in " << in << " M " << M;
          const at::Tensor ref = at::matmul(x.to(at::kDouble), hearth::nn::dequantize(w, at::kFloat).to(at::kDouble).t());
          EXPECT_LE(hearth::testing::max_rel_err(y[0], ref), hearth::testing::one_rounding_tol(dt)) << bits << " in " << in << " M " << M << " " << dt;
          for (int64_t m = 0; m < M; ++m) {
            const at::Tensor one = hearth::nn::decode_gemv(x.narrow(0, m, 1).clone(), {hearth::nn::GemvOperand{{}, &w}})[0];
            EXPECT_TRUE(at::equal(one[0], y[0][m])) << bits << " in " << in << " row " << m << " of M " << M;
          }
        }
      }
}

// The affine kernel's codes enter the FMA as fp32 subnormals against x pre-scaled by up to 2^64
// (kernels/gemv_affine.cuh): exact while |c·x| ≥ 2^-41 and |x| < 2^63. Across that window — x of
// magnitude ~2^-30 (products ~2^-26 with weights of 0.05: normal) to ~2^60 — the product is the
// dequantized reference's within one rounding, for 4 and 8 bits, bf16 and fp32 x, M = 1 and 3.
TEST(DecodeGemv, AffineHoldsAcrossMagnitudesOfX) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's kernels (GPU machine)";
  hearth::testing::FusedDecodeSwitch on(true);
  at::manual_seed(37);
  const at::Device cuda(at::kCUDA, 0);
  for (int bits : {4, 8})
    for (auto dt : {at::kBFloat16, at::kFloat}) {
      hearth::nn::QuantizedWeight w = hearth::nn::quantize(at::randn({200, 1024}) * 0.05, hearth::nn::QuantSpec{bits, 64});
      w = hearth::nn::QuantizedWeight{w.wq.to(cuda), w.scales.to(dt).to(cuda), w.biases.to(dt).to(cuda), w.spec};
      const at::Tensor wd = hearth::nn::dequantize(w, at::kFloat).to(at::kDouble);
      for (double scale : {std::ldexp(1.0, -30), 1e-3, 1.0, std::ldexp(1.0, 40), std::ldexp(1.0, 60)})
        for (int64_t M : {1, 3}) {
          const at::Tensor x = (at::randn({M, 1024}) * scale).to(dt).to(cuda);
          const std::vector<at::Tensor> y = hearth::nn::decode_gemv(x, {hearth::nn::GemvOperand{{}, &w}});
          ASSERT_EQ(y.size(), 1u);
          const at::Tensor ref = at::matmul(x.to(at::kDouble), wd.t());
          EXPECT_TRUE(y[0].isfinite().all().item<bool>()) << bits << " " << dt << " scale " << scale;
          EXPECT_LE(hearth::testing::max_rel_err(y[0], ref), hearth::testing::one_rounding_tol(dt))
              << bits << " " << dt << " scale " << scale << " M " << M;
        }
    }
}

TEST(DecodeGemv, GroupedIsSeparateBitForBitDenseAndAffine) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's kernels (GPU machine)";
  hearth::testing::FusedDecodeSwitch on(true);
  at::manual_seed(32);
  const at::Device cuda(at::kCUDA, 0);
  const int64_t in = 512;
  for (int64_t M : {1, 4}) {
    const at::Tensor x = at::randn({M, 1, in}).to(at::kBFloat16).to(cuda);
    // Dense: q/k/v-like widths, through Linear::forward_many (one launch) vs Linear::forward.
    const hearth::nn::Linear q(at::randn({512, in}).to(at::kBFloat16).to(cuda)),
        k(at::randn({128, in}).to(at::kBFloat16).to(cuda)), v(at::randn({128, in}).to(at::kBFloat16).to(cuda));
    const std::vector<at::Tensor> ys = hearth::nn::Linear::forward_many(x, {&q, &k, &v});
    ASSERT_EQ(ys.size(), 3u);
    EXPECT_TRUE(at::equal(ys[0], q.forward(x)));
    EXPECT_TRUE(at::equal(ys[1], k.forward(x)));
    EXPECT_TRUE(at::equal(ys[2], v.forward(x)));
    EXPECT_EQ(ys[2].sizes().vec(), (std::vector<int64_t>{M, 1, 128}));
    // Affine 4-bit and 8-bit: grouped vs quantized_matmul (the single-weight kernel), and close
    // to the fp32 dequantize + matmul reference.
    for (int bits : {4, 8}) {
      auto qw = [&](int64_t out) {
        hearth::nn::QuantizedWeight w = hearth::nn::quantize(at::randn({out, in}), hearth::nn::QuantSpec{bits, 64});
        return hearth::nn::QuantizedWeight{w.wq.to(cuda), w.scales.to(at::kBFloat16).to(cuda),
                                           w.biases.to(at::kBFloat16).to(cuda), w.spec};
      };
      const hearth::nn::Linear g(qw(1024)), u(qw(1024)), d(qw(96));
      const std::vector<at::Tensor> gs = hearth::nn::Linear::forward_many(x, {&g, &u, &d});
      EXPECT_TRUE(at::equal(gs[0], g.forward(x))) << bits;
      EXPECT_TRUE(at::equal(gs[1], u.forward(x))) << bits;
      EXPECT_TRUE(at::equal(gs[2], d.forward(x))) << bits;
      const at::Tensor ref = hearth::nn::quantized_matmul_ref(x.to(at::kFloat), *u.qweight());
      EXPECT_LE(hearth::testing::max_rel_err(gs[1], ref), hearth::testing::one_rounding_tol(at::kBFloat16)) << bits;
    }
  }
}

// Rows over several warps (kernels/gemv.cu): dense rows of more than 64 chunks span 2..8 warps
// whose sums meet in shared memory (bf16 in 1032: 129 chunks on 128 lanes, lane 0 has two; 2048:
// 128 lanes of 2; 4096: 256 of 2; 8192: 256 of 4; 14336: 1,792 chunks, 7 a lane; fp32 14336: 3,584
// chunks, two tiles a lane), three segments of different row counts share x (300, 77 and 8 rows:
// blocks with dead rows), and affine 4/8-bit rows at in 8192 widen past one warp (4-bit: 128 lanes
// of 2 chunks at 300 rows, 256 of 1 at 77 and 8; 8-bit: 128 of 4, 256 of 2; x in shared memory at
// M = 1, not at M = 3). A wrong chunk index or a lost warp's partial shows against the fp64
// reference; each segment must equal its own launch and each row its one-row call, bit for bit.
TEST(DecodeGemv, MultiWarpRowsMatchReferenceGroupedAndPerRow) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's kernels (GPU machine)";
  hearth::testing::FusedDecodeSwitch on(true);
  at::manual_seed(37);
  const at::Device cuda(at::kCUDA, 0);
  const std::vector<int64_t> rows = {300, 77, 8};
  for (auto dt : {at::kBFloat16, at::kHalf, at::kFloat})
    for (int64_t in : {1032, 2048, 4096, 8192, 14336}) {
      std::vector<at::Tensor> ws;
      for (int64_t r : rows) ws.push_back((at::randn({r, in}) * 0.05).to(dt).to(cuda));
      const std::vector<hearth::nn::GemvOperand> ops = {{ws[0], nullptr}, {ws[1], nullptr}, {ws[2], nullptr}};
      for (int64_t M : {1, 3}) {
        const at::Tensor x = at::randn({M, in}).to(dt).to(cuda);
        const std::vector<at::Tensor> ys = hearth::nn::decode_gemv(x, ops);
        ASSERT_EQ(ys.size(), 3u) << "dtype " << dt << " in " << in << " M " << M;
        for (size_t i = 0; i < ws.size(); ++i) {
          ASSERT_EQ(ys[i].sizes().vec(), (std::vector<int64_t>{M, rows[i]}));
          const at::Tensor ref = at::matmul(x.to(at::kDouble), ws[i].to(at::kDouble).t());
          EXPECT_LE(hearth::testing::max_rel_err(ys[i], ref), hearth::testing::one_rounding_tol(dt)) << "dtype " << dt << " in " << in << " M " << M << " seg " << i;
          const at::Tensor sep = hearth::nn::decode_gemv(x, {hearth::nn::GemvOperand{ws[i], nullptr}})[0];
          EXPECT_TRUE(at::equal(sep, ys[i])) << "dtype " << dt << " in " << in << " M " << M << " seg " << i;
        }
        for (int64_t m = 0; m < M; ++m) {
          const at::Tensor one = hearth::nn::decode_gemv(x.narrow(0, m, 1).clone(), ops)[1];
          EXPECT_TRUE(at::equal(one[0], ys[1][m])) << "dtype " << dt << " in " << in << " row " << m << " of M " << M;
        }
      }
    }
  const int64_t in = 8192;
  for (int bits : {4, 8})
    for (auto dt : {at::kBFloat16, at::kFloat}) {
      std::vector<hearth::nn::QuantizedWeight> qs;
      for (int64_t r : rows) {
        const hearth::nn::QuantizedWeight w = hearth::nn::quantize(at::randn({r, in}) * 0.05, hearth::nn::QuantSpec{bits, 64});
        qs.push_back(hearth::nn::QuantizedWeight{w.wq.to(cuda), w.scales.to(dt).to(cuda), w.biases.to(dt).to(cuda), w.spec});
      }
      const std::vector<hearth::nn::GemvOperand> ops = {{{}, &qs[0]}, {{}, &qs[1]}, {{}, &qs[2]}};
      for (int64_t M : {1, 3}) {
        const at::Tensor x = at::randn({M, in}).to(dt).to(cuda);
        const std::vector<at::Tensor> ys = hearth::nn::decode_gemv(x, ops);
        ASSERT_EQ(ys.size(), 3u) << bits << " M " << M << " " << dt;
        for (size_t i = 0; i < qs.size(); ++i) {
          const at::Tensor ref = at::matmul(x.to(at::kDouble), hearth::nn::dequantize(qs[i], at::kFloat).to(at::kDouble).t());
          EXPECT_LE(hearth::testing::max_rel_err(ys[i], ref), hearth::testing::one_rounding_tol(dt)) << bits << " M " << M << " " << dt << " seg " << i;
          const at::Tensor sep = hearth::nn::decode_gemv(x, {hearth::nn::GemvOperand{{}, &qs[i]}})[0];
          EXPECT_TRUE(at::equal(sep, ys[i])) << bits << " M " << M << " " << dt << " seg " << i;
        }
        for (int64_t m = 0; m < M; ++m) {
          const at::Tensor one = hearth::nn::decode_gemv(x.narrow(0, m, 1).clone(), ops)[0];
          EXPECT_TRUE(at::equal(one[0], ys[0][m])) << bits << " " << dt << " row " << m << " of M " << M;
        }
      }
    }
}

TEST(DecodeGemv, ForwardManyAddsAdaptersAndFallsBackWithBias) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's kernels (GPU machine)";
  hearth::testing::FusedDecodeSwitch on(true);
  at::manual_seed(33);
  const at::Device cuda(at::kCUDA, 0);
  const at::Tensor x = at::randn({1, 1, 64}).to(cuda);
  const hearth::nn::Linear a(at::randn({32, 64}).to(cuda), at::randn({32}).to(cuda));
  hearth::nn::Linear b(at::randn({32, 64}).to(cuda));
  hearth::nn::LoraAdapter ad;
  ad.a = at::randn({4, 64}).to(cuda);
  ad.b = at::randn({32, 4}).to(cuda);
  ad.scale = 2.0;
  b.add_adapter("x", ad);
  const hearth::nn::ActiveAdapters active({"x"});
  const std::vector<at::Tensor> ys = hearth::nn::Linear::forward_many(x, {&a, &b});
  EXPECT_TRUE(at::equal(ys[0], a.forward(x)));
  EXPECT_TRUE(at::equal(ys[1], b.forward(x)));
  // The adapter's delta is in: not the base weight alone.
  EXPECT_GT((ys[1] - at::matmul(x, b.weight().t())).abs().max().item<double>(), 1e-3);
  // Without the bias the base products share one launch and b's adapter is still added: the same
  // bits as each forward (a row's GEMV result does not depend on the grouping).
  const hearth::nn::Linear c(at::randn({48, 64}).to(cuda));
  const std::vector<at::Tensor> zs = hearth::nn::Linear::forward_many(x, {&c, &b});
  EXPECT_TRUE(at::equal(zs[0], c.forward(x)));
  EXPECT_TRUE(at::equal(zs[1], b.forward(x)));
  EXPECT_TRUE(at::equal(zs[1], ys[1]));
}

TEST(DecodeGemv, LoraInInferenceIsOneAddmmWithinRounding) {
  // CUDA inference with the fused kernels on adds a LoRA delta as x·Aᵀ then one addmm (rounded
  // once); with grad on (training) PEFT's op order stands. Both against float64 of the same bf16
  // inputs, for a decode row and a prefill block.
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's kernels (GPU machine)";
  hearth::testing::FusedDecodeSwitch on(true);
  at::manual_seed(35);
  const at::Device cuda(at::kCUDA, 0);
  const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(cuda);
  hearth::nn::Linear lin(at::randn({96, 64}).to(bf) * 0.1);
  hearth::nn::LoraAdapter ad;
  ad.a = at::randn({8, 64}).to(bf) * 0.1;
  ad.b = at::randn({96, 8}).to(bf) * 0.1;
  ad.scale = 2.0;
  lin.add_adapter("x", ad);
  const hearth::nn::ActiveAdapters active({"x"});
  for (int64_t rows : {1, 5}) {
    const at::Tensor x = at::randn({rows, 64}).to(bf);
    const at::Tensor xd = x.to(at::kDouble);
    const at::Tensor want = at::matmul(xd, lin.weight().to(at::kDouble).t()) +
                            2.0 * at::matmul(at::matmul(xd, ad.a.to(at::kDouble).t()), ad.b.to(at::kDouble).t());
    const double scale = want.abs().max().item<double>();
    const at::Tensor peft = lin.forward(x);  // grad mode on: PEFT's order
    at::Tensor fast;
    {
      c10::NoGradGuard no_grad;
      fast = lin.forward(x);
    }
    // Three roundings at most (the base product, x·Aᵀ, the sum): within 3·2^-9 of the largest output.
    EXPECT_LE((fast.to(at::kDouble) - want).abs().max().item<double>() / scale, 6e-3) << rows;
    EXPECT_LE((peft.to(at::kDouble) - want).abs().max().item<double>() / scale, 8e-3) << rows;
    // The delta is in: not the base product alone.
    EXPECT_GT((fast.to(at::kDouble) - at::matmul(xd, lin.weight().to(at::kDouble).t())).abs().max().item<double>(),
              1e-2 * scale)
        << rows;
  }
}

TEST(DecodeGemv, GroupedGqaDecodeAttentionMatchesRepeatKv) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
  at::manual_seed(34);
  const at::Device cuda(at::kCUDA, 0);
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (bool explicit_mask : {false, true})
      for (int64_t T : {1, 3}) {
        const int64_t B = 2, H = 8, Hkv = 2, D = 64, S = 40;
        const at::Tensor q = at::randn({B, T, H, D}).to(dt).to(cuda).transpose(1, 2);
        const at::Tensor k = at::randn({B, Hkv, S, D}).to(dt).to(cuda);
        const at::Tensor v = at::randn({B, Hkv, S, D}).to(dt).to(cuda);
        hearth::nn::AttentionParams p;
        p.scale = 0.125;
        p.q_pos0 = S - T - 5;  // the last 5 keys are in the future: masked
        p.k_pos0 = 0;
        if (explicit_mask) {
          p.mask = hearth::nn::attention_mask(T, S, p, dt, cuda).unsqueeze(0).unsqueeze(0).expand({B, 1, T, S}).contiguous();
        }
        at::Tensor ref, got;
        {
          hearth::testing::FusedDecodeSwitch off(false);
          ref = hearth::nn::attention(q, k, v, p);
        }
        {
          hearth::testing::FusedDecodeSwitch on(true);
          got = hearth::nn::attention(q, k, v, p);
        }
        ASSERT_EQ(got.sizes(), ref.sizes());
        EXPECT_LE(hearth::testing::max_rel_err(got, ref), dt == at::kFloat ? 1e-5 : 1e-2)
            << "dtype " << dt << " mask " << explicit_mask << " T " << T;
      }
}
