// nn::fused_rms_norm (nn/fused_ops.h): the Gemma 4 / Qwen3.5 RMSNorm variants in one kernel. On the
// CPU it computes nothing (undefined result: the caller's reference ops run) and checks shapes; on
// CUDA each variant (weight after the rounding, weight in fp32 with and without Qwen's 1 + w offset,
// no weight; then · silu(gate) or + residual) matches the reference ops of the model files within
// one rounding per rounded step, on contiguous and strided rows. The CUDA test skips without a GPU.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/torch_compat.h"
#include "nn/fused_ops.h"

namespace {

using hearth::nn::fused_rms_norm;
using hearth::nn::NormScale;

// The reference ops of Gemma4RMSNorm / Qwen3_5RMSNorm (kFp32, offset 0 / 1), the weightless norm
// (kNone) and LlamaRMSNorm's order (kAfterRound), without the gate or the residual add.
at::Tensor fused_norm_reference(const at::Tensor& x, const at::Tensor& w, double eps, NormScale scale, double offset) {
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, true) + eps);
  if (scale == NormScale::kAfterRound) return w * h.to(x.scalar_type());
  if (scale == NormScale::kFp32) {
    at::Tensor wf = w.to(at::kFloat);
    if (offset != 0.0) wf = wf + offset;
    h = h * wf;
  }
  return h.to(x.scalar_type());
}

double fused_norm_ulp(at::ScalarType st) {
  return st == at::kBFloat16 ? 1.0 / 128 : st == at::kHalf ? 1.0 / 1024 : 1e-6;
}

// max over elements of |got − want| − tol (≤ 0 when every element is within its tolerance).
double fused_norm_excess(const at::Tensor& got, const at::Tensor& want, const at::Tensor& tol) {
  return ((got.to(at::kFloat) - want.to(at::kFloat)).abs() - tol).max().item<double>();
}

}  // namespace

TEST(FusedNorm, CpuComputesNothingAndChecksShapes) {
  at::manual_seed(1);
  const at::Tensor x = at::randn({2, 3, 16}), w = at::randn({16});
  EXPECT_FALSE(fused_rms_norm(x, w, 1e-6, NormScale::kFp32, 1.0).defined());
  EXPECT_FALSE(fused_rms_norm(x, at::Tensor(), 1e-6, NormScale::kNone).defined());
  EXPECT_THROW(fused_rms_norm(x, at::randn({15}), 1e-6, NormScale::kFp32), hearth::Error);
  EXPECT_THROW(fused_rms_norm(x, w, 1e-6, NormScale::kAfterRound, 0.0, at::randn({2, 3, 15})), hearth::Error);
  EXPECT_THROW(fused_rms_norm(x, w, 1e-6, NormScale::kFp32, 0.0, x, x), hearth::Error);  // gate and add together
  EXPECT_FALSE(hearth::nn::fused_add_rms_norm(x, x, w, 1e-6, NormScale::kFp32, 1.0).first.defined());
  EXPECT_THROW(hearth::nn::fused_add_rms_norm(x, at::randn({2, 3, 15}), w, 1e-6, NormScale::kFp32), hearth::Error);
}

TEST(FusedNorm, CudaVariantsMatchTheModelsReferenceOps) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
#ifndef HEARTH_WITH_CUDA_KERNELS
  GTEST_SKIP() << "built without Hearth's CUDA kernels";
#endif
  const bool was = hearth::nn::set_fused_decode(true);
  const at::Device cuda(at::kCUDA, 0);
  struct Case {
    NormScale scale;
    double offset;
  };
  const Case cases[] = {{NormScale::kFp32, 0.0}, {NormScale::kFp32, 1.0}, {NormScale::kNone, 0.0},
                        {NormScale::kAfterRound, 0.0}};
  for (at::ScalarType st : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const double ulp = fused_norm_ulp(st);
    for (int64_t C : {128, 256, 2560, 5000}) {
      for (const Case& c : cases) {
        at::manual_seed(C + static_cast<int64_t>(c.scale));
        const auto o = at::TensorOptions().dtype(st).device(cuda);
        const at::Tensor w = at::randn({C}, o) * 0.3;
        const at::Tensor wide = at::randn({2, 3, 4, 2 * C}, o) * 2;
        for (const at::Tensor& x : {wide.narrow(-1, 0, C).contiguous(), wide.narrow(-1, C, C)}) {  // strided rows too
          const std::string what = std::string(c10::toString(st)) + " C=" + std::to_string(C) + " scale " +
                                   std::to_string(static_cast<int>(c.scale)) + " offset " + std::to_string(c.offset) +
                                   (x.is_contiguous() ? " contiguous" : " strided");
          const at::Tensor ref = fused_norm_reference(x, w, 1e-6, c.scale, c.offset);
          const at::Tensor y = fused_rms_norm(x, w, 1e-6, c.scale, c.offset);
          ASSERT_TRUE(y.defined()) << what;
          EXPECT_TRUE(y.is_contiguous() && y.sizes() == x.sizes() && y.scalar_type() == st) << what;
          // The weighted product can move by the weight times one rounding of the normalised value.
          const at::Tensor rf = ref.to(at::kFloat).abs();
          EXPECT_LE(fused_norm_excess(y, ref, rf * ulp * 2 + 1e-6), 0.0) << what;

          const at::Tensor residual = at::randn(x.sizes(), o) * 4;
          const at::Tensor want_add = residual + ref;  // residual + norm(x)
          const at::Tensor got_add = fused_rms_norm(x, w, 1e-6, c.scale, c.offset, {}, residual);
          EXPECT_LE(fused_norm_excess(got_add, want_add, (want_add.to(at::kFloat).abs() + rf * 2) * ulp + 1e-6), 0.0)
              << what << " + residual";

          if (c.scale == NormScale::kAfterRound) {  // Qwen3_5RMSNormGated: · silu(gate.float()), one rounding
            const at::Tensor gate = at::randn(x.sizes(), o) * 3;
            const at::Tensor silu = at::silu(gate.to(at::kFloat));
            const at::Tensor want_g = (ref * silu).to(st);
            const at::Tensor got_g = fused_rms_norm(x, w, 1e-6, c.scale, 0.0, gate);
            EXPECT_LE(fused_norm_excess(got_g, want_g, (rf * silu.abs() * 3) * ulp + 1e-6), 0.0) << what << " gated";
          }
        }
      }
    }
  }
  // The residual add before the norm (Qwen3.5's post-attention norm): the sum bit-identical to x + r.
  for (at::ScalarType st : {at::kFloat, at::kBFloat16}) {
    const auto o = at::TensorOptions().dtype(st).device(cuda);
    const at::Tensor x = at::randn({2, 1, 1024}, o), r = at::randn({2, 1, 1024}, o) * 3, w = at::randn({1024}, o) * 0.2;
    auto [sum, y] = hearth::nn::fused_add_rms_norm(x, r, w, 1e-6, NormScale::kFp32, 1.0);
    ASSERT_TRUE(sum.defined() && y.defined());
    EXPECT_TRUE(at::equal(sum, r + x)) << c10::toString(st);
    const at::Tensor ref = fused_norm_reference(r + x, w, 1e-6, NormScale::kFp32, 1.0);
    EXPECT_LE(fused_norm_excess(y, ref, ref.to(at::kFloat).abs() * fused_norm_ulp(st) * 2 + 1e-6), 0.0) << c10::toString(st);
  }
  // Autograd recording, a weight of another dtype, or the switch off: nothing computed.
  const at::Tensor xg = at::randn({2, 64}, at::TensorOptions().device(cuda)).requires_grad_(true);
  EXPECT_FALSE(fused_rms_norm(xg, at::randn({64}, at::TensorOptions().device(cuda)), 1e-6, NormScale::kFp32).defined());
  const at::Tensor xb = at::randn({2, 64}, at::TensorOptions().device(cuda).dtype(at::kBFloat16));
  EXPECT_FALSE(fused_rms_norm(xb, at::randn({64}, at::TensorOptions().device(cuda)), 1e-6, NormScale::kFp32).defined());
  hearth::nn::set_fused_decode(false);
  EXPECT_FALSE(fused_rms_norm(xb, at::Tensor(), 1e-6, NormScale::kNone).defined());
  hearth::nn::set_fused_decode(was);
}
