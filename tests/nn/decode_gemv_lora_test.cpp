// Tests for the LoRA term in the decode GEMV's epilogue (kernels/gemv.cu GemvSegment::lora_*,
// nn/decode_gemv.h GemvOperand, and nn::Linear's inference path that uses it): against float64 on
// the same device, the path taken checked bit for bit against the launches it should be, and the
// cases it must leave to the addmm path. The CUDA cases are skipped on this CPU build; run on the GPU.
#include <gtest/gtest.h>

#include <c10/core/GradMode.h>

#include "core/torch_compat.h"
#include "nn/decode_gemv.h"
#include "cuda_kernel_test_util.h"
#include "nn/fused_ops.h"
#include "nn/linear.h"
#include "nn/quant.h"
#include "nn/rms_norm.h"

namespace {

using hearth::nn::GemvOperand;

hearth::nn::LoraAdapter lg_adapter(int64_t out, int64_t in, int64_t r, double scale, const at::TensorOptions& o) {
  hearth::nn::LoraAdapter ad;
  ad.a = (at::randn({r, in}) * 0.1).to(o);
  ad.b = (at::randn({out, r}) * 0.1).to(o);
  ad.scale = scale;
  return ad;
}

// PEFT's result in float64 of the same (rounded) inputs: x·Wᵀ + scale·(x·Aᵀ)·Bᵀ.
at::Tensor lg_want(const at::Tensor& x, const at::Tensor& w, const hearth::nn::LoraAdapter& ad) {
  const at::Tensor xd = x.to(at::kDouble);
  return at::matmul(xd, w.to(at::kDouble).t()) +
         ad.scale * at::matmul(at::matmul(xd, ad.a.to(at::kDouble).t()), ad.b.to(at::kDouble).t());
}

}  // namespace

TEST(DecodeGemvLora, EpilogueMatchesFp64ForEveryLaneLayoutAndRank) {
  // Row layouts: in 64 (4 lanes a row), 2048 (one warp), 8192 (256 lanes over 8 warps); ranks below,
  // at and above a row's lanes (the loop past the first share). Dense in three dtypes and MLX 4-bit.
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's kernels (GPU machine)";
  hearth::testing::FusedDecodeSwitch on(true);
  c10::NoGradGuard no_grad;
  at::manual_seed(41);
  const at::Device cuda(at::kCUDA, 0);
  for (auto dt : {at::kBFloat16, at::kHalf, at::kFloat})
    for (auto [out, in] : {std::pair<int64_t, int64_t>{96, 64}, {700, 2048}, {300, 8192}})
      for (int64_t r : {1, 8, 40}) {
        const auto o = at::TensorOptions().dtype(dt).device(cuda);
        const at::Tensor w = (at::randn({out, in}) * 0.05).to(o);
        const at::Tensor x = at::randn({1, in}).to(o);
        const hearth::nn::LoraAdapter ad = lg_adapter(out, in, r, 1.75, o);
        const std::vector<at::Tensor> h = hearth::nn::decode_gemv(x, {GemvOperand{ad.a, nullptr}});
        ASSERT_EQ(h.size(), 1u);
        GemvOperand op{w, nullptr, ad.b, h[0], ad.scale};
        const std::vector<at::Tensor> y = hearth::nn::decode_gemv(x, {op});
        ASSERT_EQ(y.size(), 1u) << dt << " [" << out << ", " << in << "] r " << r;
        const std::string where = "dtype " + std::string(c10::toString(dt)) + " [" + std::to_string(out) + ", " +
                                  std::to_string(in) + "] r " + std::to_string(r);
        // Against h as the kernel rounded it (the epilogue's own error: one rounding of the output).
        const at::Tensor exact = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t()) +
                                 ad.scale * at::matmul(h[0].to(at::kDouble), ad.b.to(at::kDouble).t());
        EXPECT_LE(hearth::testing::max_rel_err(y[0], exact), hearth::testing::one_rounding_tol(dt)) << where;
        // Against PEFT's product in float64 (h's rounding too).
        EXPECT_LE(hearth::testing::max_rel_err(y[0], lg_want(x, w, ad)), 2 * hearth::testing::one_rounding_tol(dt)) << where;
        // The term is in.
        const at::Tensor base = hearth::nn::decode_gemv(x, {GemvOperand{w, nullptr}})[0];
        EXPECT_GT((y[0].to(at::kDouble) - base.to(at::kDouble)).abs().max().item<double>(),
                  0.05 * exact.abs().max().item<double>())
            << where;
      }
  // MLX affine 4/8-bit bases, group 64, with the term (kernels/gemv_affine.cuh: the row group's
  // first warp adds it; ranks below, at and past its 32 lanes; rows not a multiple of 4; rows of 2,
  // 32 and 256 chunks, i.e. 1 to 4 warps per row group).
  const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(cuda);
  for (int bits : {4, 8})
    for (auto [out, in] : {std::pair<int64_t, int64_t>{256, 1024}, {301, 8192}, {98, 64}})
      for (int64_t r : {1, 16, 40}) {
        hearth::nn::QuantizedWeight q = hearth::nn::quantize((at::randn({out, in}) * 0.05).to(bf), hearth::nn::QuantSpec{bits, 64});
        q = hearth::nn::QuantizedWeight{q.wq.to(cuda), q.scales.to(cuda), q.biases.to(cuda), q.spec};
        const at::Tensor x = at::randn({1, in}).to(bf);
        const hearth::nn::LoraAdapter ad = lg_adapter(out, in, r, 2.0, bf);
        const at::Tensor h = hearth::nn::decode_gemv(x, {GemvOperand{ad.a, nullptr}})[0];
        const std::vector<at::Tensor> y = hearth::nn::decode_gemv(x, {GemvOperand{{}, &q, ad.b, h, ad.scale}});
        ASSERT_EQ(y.size(), 1u);
        const std::string where = std::to_string(bits) + "-bit [" + std::to_string(out) + ", " + std::to_string(in) +
                                  "] r " + std::to_string(r);
        const at::Tensor wd = hearth::nn::dequantize(q, at::kFloat);
        const at::Tensor exact = at::matmul(x.to(at::kDouble), wd.to(at::kDouble).t()) +
                                 ad.scale * at::matmul(h.to(at::kDouble), ad.b.to(at::kDouble).t());
        EXPECT_LE(hearth::testing::max_rel_err(y[0], exact), hearth::testing::one_rounding_tol(at::kBFloat16)) << where;
        EXPECT_LE(hearth::testing::max_rel_err(y[0], lg_want(x, wd, ad)), 2e-2) << where;
      }
  hearth::nn::QuantizedWeight q = hearth::nn::quantize((at::randn({256, 1024}) * 0.05).to(bf), hearth::nn::QuantSpec{4, 64});
  q = hearth::nn::QuantizedWeight{q.wq.to(cuda), q.scales.to(cuda), q.biases.to(cuda), q.spec};
  const hearth::nn::LoraAdapter ad = lg_adapter(256, 1024, 16, 2.0, bf);
  // Two rows of x: the epilogue declines (one row only), so the caller keeps the addmm path.
  const at::Tensor x2 = at::randn({2, 1024}).to(bf);
  const at::Tensor h2 = at::matmul(x2, ad.a.t());
  EXPECT_TRUE(hearth::nn::decode_gemv(x2, {GemvOperand{{}, &q, ad.b, h2, ad.scale}}).empty());
}

TEST(DecodeGemvLora, LinearForwardsPutTheActiveAdapterInTheEpilogue) {
  // forward (o/down), forward_many (q/k/v with adapters on q and v only) and forward_many_normed
  // (the norm in the x·Aᵀ launch): each equals the launches it should be, bit for bit, and PEFT's
  // float64 result within rounding. With two adapters stacked, a RowAdapters scope, or grad on,
  // the epilogue is not used and the addmm / PEFT order still gives the right result.
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's kernels (GPU machine)";
  hearth::testing::FusedDecodeSwitch on(true);
  at::manual_seed(42);
  const at::Device cuda(at::kCUDA, 0);
  const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(cuda);
  const int64_t C = 512;
  hearth::nn::Linear q((at::randn({C, C}) * 0.05).to(bf)), k((at::randn({128, C}) * 0.05).to(bf)),
      v((at::randn({128, C}) * 0.05).to(bf));
  const hearth::nn::LoraAdapter aq = lg_adapter(C, C, 8, 2.0, bf), av = lg_adapter(128, C, 8, 2.0, bf),
                                aq2 = lg_adapter(C, C, 4, 0.5, bf);
  q.add_adapter("x", aq);
  v.add_adapter("x", av);
  q.add_adapter("y", aq2);
  const at::Tensor x = at::randn({1, 1, C}).to(bf);
  c10::NoGradGuard no_grad;
  {
    const hearth::nn::ActiveAdapters active({"x"});
    // forward: the A launch, then the base launch with B·h in its epilogue.
    const at::Tensor hq = hearth::nn::decode_gemv(x, {GemvOperand{aq.a, nullptr}})[0];
    const at::Tensor want_q = hearth::nn::decode_gemv(x, {GemvOperand{q.weight(), nullptr, aq.b, hq, aq.scale}})[0];
    const at::Tensor yq = q.forward(x);
    EXPECT_TRUE(at::equal(yq, want_q));
    EXPECT_LE(hearth::testing::max_rel_err(yq, lg_want(x, q.weight(), aq)), 2e-2);
    // forward_many: one A launch for q and v, one base launch for q/k/v.
    const std::vector<at::Tensor> hs = hearth::nn::decode_gemv(x, {GemvOperand{aq.a, nullptr}, GemvOperand{av.a, nullptr}});
    const std::vector<at::Tensor> want = hearth::nn::decode_gemv(
        x, {GemvOperand{q.weight(), nullptr, aq.b, hs[0], aq.scale}, GemvOperand{k.weight(), nullptr},
            GemvOperand{v.weight(), nullptr, av.b, hs[1], av.scale}});
    const std::vector<at::Tensor> ys = hearth::nn::Linear::forward_many(x, {&q, &k, &v});
    ASSERT_EQ(ys.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(ys[i], want[i])) << i;
    EXPECT_EQ(ys[0].sizes().vec(), (std::vector<int64_t>{1, 1, C}));
    EXPECT_LE(hearth::testing::max_rel_err(ys[2], lg_want(x, v.weight(), av)), 2e-2);
    EXPECT_LE(hearth::testing::max_rel_err(ys[1], at::matmul(x.to(at::kDouble), k.weight().to(at::kDouble).t())), 1e-2);
    // forward_many_normed: the norm inside the A launch, then the plain base launch on its normed x.
    hearth::nn::RMSNorm norm((at::rand({C}) + 0.5).to(bf), 1e-5);
    const at::Tensor res = at::randn({1, 1, C}).to(bf);
    const hearth::nn::NormedGemv g =
        hearth::nn::decode_gemv_normed(x, res, norm.weight(), 1e-5, {GemvOperand{aq.a, nullptr}, GemvOperand{av.a, nullptr}});
    ASSERT_EQ(g.ys.size(), 2u);
    const hearth::nn::Linear::NormedProducts p = hearth::nn::Linear::forward_many_normed({x, res, &norm}, {&q, &k, &v});
    auto [sum, normed] = norm.forward_add(x, res);
    EXPECT_TRUE(at::equal(p.sum, sum));
    EXPECT_TRUE(at::equal(p.normed, normed));
    const std::vector<at::Tensor> want_n = hearth::nn::decode_gemv(
        normed, {GemvOperand{q.weight(), nullptr, aq.b, g.ys[0], aq.scale}, GemvOperand{k.weight(), nullptr},
                 GemvOperand{v.weight(), nullptr, av.b, g.ys[1], av.scale}});
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(p.ys[i], want_n[i])) << i;
    EXPECT_LE(hearth::testing::max_rel_err(p.ys[0], lg_want(normed, q.weight(), aq)), 2e-2);
    // A RowAdapters scope (the server's batch): each row's own adapters, the addmm-free row path.
    const hearth::nn::RowAdapters rows({{"x"}});
    EXPECT_LE(hearth::testing::max_rel_err(q.forward(x), lg_want(x, q.weight(), aq)), 2e-2);
  }
  {
    // Two adapters stacked on q: both added (not the epilogue, which takes one).
    const hearth::nn::ActiveAdapters active({"x", "y"});
    const at::Tensor want = lg_want(x, q.weight(), aq) + aq2.scale * at::matmul(at::matmul(x.to(at::kDouble), aq2.a.to(at::kDouble).t()),
                                                                                aq2.b.to(at::kDouble).t());
    EXPECT_LE(hearth::testing::max_rel_err(q.forward(x), want), 2e-2);
  }
  {
    // Grad on (training): PEFT's order, still the adapter's result.
    c10::AutoGradMode grad(true);
    const hearth::nn::ActiveAdapters active({"x"});
    EXPECT_LE(hearth::testing::max_rel_err(q.forward(x), lg_want(x, q.weight(), aq)), 2e-2);
  }
}
