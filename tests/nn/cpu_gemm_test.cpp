// The CPU fast paths of nn/cpu_gemm.h: the column-block fp32 GEMM behind Linear (against at::linear
// and when it steps aside), the per-head attention (against a naive double loop and the plain path,
// with strided caches, GQA, offsets and windows), the dequantize + GEMM prefill path of the
// quantized matmul (every instruction set, against the reference), and ReferenceKernelsScope.
#include "nn/cpu_gemm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "nn/attention.h"
#include "nn/linear.h"
#include "nn/quant.h"
#include "nn/quant_simd.h"

namespace cg = hearth::nn::cpu;
using hearth::nn::AttentionBackend;
using hearth::nn::AttentionParams;

namespace {

double cpugemm_max_rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).abs().max() / b.to(at::kDouble).abs().max().clamp_min(1e-30))
      .item<double>();
}

// The fast GEMM is present on this build (Debian's and PyTorch's libtorch carry oneDNN); a test
// that needs it says so instead of passing vacuously.
#define CPUGEMM_REQUIRE_FAST()                                                  \
  if (!cg::fast_gemm_enabled()) GTEST_SKIP() << "dnnl_sgemm not in this process"

// Naive causal (+ window) attention in double, as tests/nn/attention_test.cpp's.
at::Tensor cpugemm_naive_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionParams& p) {
  auto Q = q.to(at::kDouble), K = k.to(at::kDouble), V = v.to(at::kDouble);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), S = k.size(2), rep = H / k.size(1);
  at::Tensor out = at::zeros({B, H, T, D}, at::kDouble);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      at::Tensor w = at::matmul(Q[b][h], K[b][h / rep].t()) * p.scale;  // [T, S]
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < S; ++j) {
          const int64_t qi = p.q_pos0 + i, kj = p.k_pos0 + j;
          if (!(kj <= qi && (!p.sliding_window || kj > qi - *p.sliding_window))) w[i][j] = -INFINITY;
        }
      out[b][h] = at::matmul(at::softmax(w, -1), V[b][h / rep]);
    }
  return out;
}

}  // namespace

TEST(CpuGemm, LinearMatchesAtLinear) {
  CPUGEMM_REQUIRE_FAST();
  at::manual_seed(21);
  // N = 100 does not split into 16-column blocks evenly; K = 384 is the starter's width.
  for (auto shape : std::vector<std::vector<int64_t>>{{1, 384}, {4, 384}, {128, 384}, {2, 40, 384}, {300, 384}}) {
    for (int64_t N : {100, 1024, 3000}) {
      at::Tensor x = at::randn(shape), w = at::randn({N, 384});
      at::Tensor y = cg::linear(x, w);
      ASSERT_TRUE(y.defined());
      at::Tensor ref = at::linear(x, w);
      ASSERT_EQ(y.sizes(), ref.sizes());
      EXPECT_LT(cpugemm_max_rel(y, ref), 1e-5) << x.sizes() << " N " << N;
    }
  }
}

TEST(CpuGemm, LinearStepsAsideWhereItDoesNotApply) {
  CPUGEMM_REQUIRE_FAST();
  at::Tensor w = at::randn({64, 32});
  EXPECT_FALSE(cg::linear(at::randn({0, 32}), w).defined());  // no rows
  EXPECT_FALSE(cg::linear(at::randn({32, 32}, at::kDouble), w.to(at::kDouble)).defined());
  EXPECT_FALSE(cg::linear(at::randn({32, 32}), at::randn({32, 64}).t()).defined());  // w not contiguous
  {
    at::Tensor xg = at::randn({32, 32}).requires_grad_();
    EXPECT_FALSE(cg::linear(xg, w).defined());  // autograd records at::linear
  }
  {
    cg::ReferenceKernelsScope outer;
    EXPECT_FALSE(cg::fast_gemm_enabled());
    {
      cg::ReferenceKernelsScope inner;
      EXPECT_FALSE(cg::linear(at::randn({32, 32}), w).defined());
    }
    EXPECT_FALSE(cg::fast_gemm_enabled());  // the outer scope still holds
  }
  EXPECT_TRUE(cg::fast_gemm_enabled());
  const bool prev = cg::set_fast_gemm(false);
  EXPECT_FALSE(cg::linear(at::randn({32, 32}), w).defined());
  cg::set_fast_gemm(prev);
  EXPECT_TRUE(cg::linear(at::randn({32, 32}), w).defined());
}

TEST(CpuGemm, LinearModuleAddsBiasOnTheFastPath) {
  CPUGEMM_REQUIRE_FAST();
  at::manual_seed(22);
  at::Tensor w = at::randn({48, 64}), b = at::randn({48}), x = at::randn({3, 20, 64});
  hearth::nn::Linear lin(w, b);
  at::Tensor y = lin.forward(x);
  EXPECT_LT(cpugemm_max_rel(y, at::linear(x, w, b)), 1e-5);
}

TEST(CpuGemm, StridedSgemmWithAlpha) {
  CPUGEMM_REQUIRE_FAST();
  at::manual_seed(23);
  // x and w are column blocks of wider matrices; y is written into columns 5.. of a wider output.
  at::Tensor xs = at::randn({7, 20}), ws = at::randn({9, 30}), wn = at::randn({12, 40});
  at::Tensor y = at::zeros({7, 25});
  cg::sgemm_nt(7, 9, 12, xs.data_ptr<float>() + 3, 20, ws.data_ptr<float>() + 2, 30, y.data_ptr<float>() + 5, 25, 0.5f);
  at::Tensor want = at::matmul(xs.narrow(1, 3, 12), ws.narrow(1, 2, 12).t()) * 0.5;
  EXPECT_LT(cpugemm_max_rel(y.narrow(1, 5, 9), want), 1e-6);
  EXPECT_EQ(y.narrow(1, 0, 5).abs().sum().item<float>(), 0.0f);  // columns outside the block untouched
  at::Tensor z = at::zeros({7, 10});
  cg::sgemm_nn(7, 10, 12, xs.data_ptr<float>(), 20, wn.data_ptr<float>() + 1, 40, z.data_ptr<float>(), 10);
  EXPECT_LT(cpugemm_max_rel(z, at::matmul(xs.narrow(1, 0, 12), wn.narrow(1, 1, 10))), 1e-6);
}

TEST(CpuGemm, ColumnBlocksCoverEveryColumnOnce) {
  for (int64_t N : {1, 15, 16, 17, 100, 1000}) {
    std::vector<int> hits(static_cast<size_t>(N), 0);
    cg::for_column_blocks(N, 8, [&](int64_t n0, int64_t n1) {
      ASSERT_LE(0, n0);
      ASSERT_LT(n0, n1);
      ASSERT_LE(n1, N);
      for (int64_t n = n0; n < n1; ++n) ++hits[static_cast<size_t>(n)];
    });
    for (int64_t n = 0; n < N; ++n) EXPECT_EQ(hits[static_cast<size_t>(n)], 1) << "N " << N << " column " << n;
  }
}

TEST(CpuGemm, AttentionMatchesNaiveAndPlain) {
  CPUGEMM_REQUIRE_FAST();
  at::manual_seed(24);
  struct Case {
    int64_t B, H, Hkv, T, S, D, q0, k0;
    std::optional<int64_t> window;
  };
  // Causal square (prefill), GQA, a chunk after a cached prefix, a sliding window with offsets.
  for (const Case& c : std::vector<Case>{{1, 6, 6, 128, 128, 64, 0, 0, {}},
                                         {2, 4, 2, 17, 17, 8, 0, 0, {}},
                                         {1, 4, 1, 9, 30, 16, 21, 0, {}},
                                         {2, 2, 1, 12, 20, 8, 30, 22, 5}}) {
    // q as the transposed view of [B, T, H, D] (what the projections give), k/v as the first S
    // positions of a larger cache buffer: both strided.
    at::Tensor q = at::randn({c.B, c.T, c.H, c.D}).transpose(1, 2);
    at::Tensor k = at::randn({c.B, c.Hkv, c.S + 7, c.D}).narrow(2, 0, c.S);
    at::Tensor v = at::randn({c.B, c.Hkv, c.S + 7, c.D}).narrow(2, 0, c.S);
    AttentionParams p;
    p.scale = 1 / std::sqrt(static_cast<double>(c.D));
    p.q_pos0 = c.q0;
    p.k_pos0 = c.k0;
    p.sliding_window = c.window;
    at::Tensor fast = hearth::nn::attention(q, k, v, p);
    // The fast path writes [B, T, H, D] and returns its [B, H, T, D] view: the layout shows it ran.
    EXPECT_TRUE(fast.transpose(1, 2).is_contiguous()) << "T " << c.T;
    p.backend = AttentionBackend::kPlain;
    at::Tensor plain = hearth::nn::attention(q, k, v, p);
    EXPECT_TRUE(plain.is_contiguous());
    EXPECT_LT((fast.to(at::kDouble) - cpugemm_naive_attention(q, k, v, p)).abs().max().item<double>(), 2e-6);
    EXPECT_LT((fast - plain).abs().max().item<float>(), 2e-6);
  }
}

TEST(CpuGemm, AttentionFullyMaskedRowAsThePlainPath) {
  CPUGEMM_REQUIRE_FAST();
  at::manual_seed(25);
  // Keys at positions 10..13, queries at 0..2: no query sees any key. The additive-mask path gives
  // every key the same weight (the mean of v); the fast path must too.
  at::Tensor q = at::randn({1, 2, 3, 4}), k = at::randn({1, 2, 4, 4}), v = at::randn({1, 2, 4, 4});
  AttentionParams p;
  p.scale = 0.5;
  p.k_pos0 = 10;
  at::Tensor fast = hearth::nn::attention(q, k, v, p);
  p.backend = AttentionBackend::kPlain;
  at::Tensor plain = hearth::nn::attention(q, k, v, p);
  EXPECT_LT((fast - plain).abs().max().item<float>(), 1e-6);
  EXPECT_LT((fast[0][1][2] - v[0][1].mean(0)).abs().max().item<float>(), 1e-6);
}

TEST(CpuGemm, AttentionDecodeStepAndExplicitMaskKeepThePlainPath) {
  at::Tensor q = at::randn({1, 2, 1, 8}), k = at::randn({1, 2, 5, 8}), v = at::randn({1, 2, 5, 8});
  AttentionParams p;
  p.q_pos0 = 4;
  EXPECT_TRUE(hearth::nn::attention(q, k, v, p).is_contiguous());  // T = 1: [B, H, T, D] itself
  at::Tensor q2 = at::randn({1, 2, 3, 8});
  p.q_pos0 = 2;
  p.mask = at::zeros({1, 1, 3, 5});
  at::Tensor out = hearth::nn::attention(q2, k, v, p);
  EXPECT_TRUE(out.is_contiguous());
}

TEST(CpuGemm, QuantizedPrefillPathMatchesReferenceEveryIsa) {
  CPUGEMM_REQUIRE_FAST();
  using hearth::nn::simd::Isa;
  at::manual_seed(26);
  const int64_t in = 256, out = 300;  // 300 rows: several tiles per thread, a ragged last block
  const Isa best = hearth::nn::simd::active_isa();
  for (Isa isa : {Isa::kNone, Isa::kAvx2, Isa::kAvx512}) {
    if (static_cast<int>(isa) > static_cast<int>(best)) break;
    const Isa prev = hearth::nn::simd::set_isa_cap(isa);
    for (auto sdt : {at::kFloat, at::kBFloat16})
      for (int bits : {3, 4, 8})
        for (int gs : {32, 64, 128}) {
          auto q = hearth::nn::quantize(at::randn({out, in}).to(sdt), hearth::nn::QuantSpec{bits, gs});
          at::Tensor x = at::randn({2, 65, in});  // 130 rows: past the SIMD kernel's 64
          at::Tensor y = hearth::nn::quantized_matmul(x, q);
          at::Tensor ref = hearth::nn::quantized_matmul_ref(x, q);
          EXPECT_LT(cpugemm_max_rel(y, ref), 1e-5)
              << "isa " << static_cast<int>(isa) << " bits " << bits << " gs " << gs << " " << sdt;
          const bool was = cg::set_fast_gemm(false);  // the tiled dequantize + BLAS path
          at::Tensor tiled = hearth::nn::quantized_matmul(x, q);
          cg::set_fast_gemm(was);
          EXPECT_LT(cpugemm_max_rel(y, tiled), 1e-5);
        }
    hearth::nn::simd::set_isa_cap(prev);
  }
}
