// nn::add_rms_norm and nn::silu_mul (nn/fused_ops.h): on the CPU they are exactly the reference ops
// (residual add, LlamaRMSNorm; at::silu · up); on CUDA with HEARTH_WITH_CUDA_KERNELS the fused
// kernels (kernels/norm_act.cu) against those same ops on the same device — the sum and silu_mul
// bit-identical, the norm within one rounding of the dtype. The CUDA tests skip without a GPU.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/torch_compat.h"
#include "nn/fused_ops.h"
#include "nn/rms_norm.h"

namespace {

using hearth::nn::add_rms_norm;
using hearth::nn::silu_mul;

at::Tensor fused_ops_ref_norm(const at::Tensor& s, const at::Tensor& w, double eps) {
  at::Tensor h = s.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, true) + eps);
  return w * h.to(s.scalar_type());
}

// Restores the fused switch at the end of a test.
struct FusedOpsSwitch {
  bool was;
  explicit FusedOpsSwitch(bool on) : was(hearth::nn::set_fused_decode(on)) {}
  ~FusedOpsSwitch() { hearth::nn::set_fused_decode(was); }
};

}  // namespace

TEST(FusedOps, CpuIsTheReferenceOps) {
  FusedOpsSwitch on(true);  // no kernels on the CPU: the switch changes nothing there
  at::manual_seed(3);
  const at::Tensor x = at::randn({2, 3, 40}), r = at::randn({2, 3, 40}), w = at::randn({40});
  auto [s, y] = add_rms_norm(x, r, w, 1e-5);
  EXPECT_TRUE(at::equal(s, x + r));
  EXPECT_TRUE(at::equal(y, fused_ops_ref_norm(x + r, w, 1e-5)));
  auto [s0, y0] = add_rms_norm(x, at::Tensor(), w, 1e-5);
  EXPECT_TRUE(at::equal(s0, x));
  EXPECT_TRUE(at::equal(y0, fused_ops_ref_norm(x, w, 1e-5)));
  hearth::nn::RMSNorm norm(w, 1e-5);
  EXPECT_TRUE(at::equal(norm.forward_add(x, r).second, norm.forward(x + r)));
  EXPECT_TRUE(at::equal(silu_mul(x, r), at::silu(x) * r));
  EXPECT_THROW(add_rms_norm(x, r, at::randn({39}), 1e-5), hearth::Error);
}

TEST(FusedOps, CudaKernelsMatchTheReferenceOps) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
#ifndef HEARTH_WITH_CUDA_KERNELS
  GTEST_SKIP() << "built without Hearth's CUDA kernels";
#endif
  FusedOpsSwitch on(true);
  const at::Device cuda(at::kCUDA, 0);
  for (at::ScalarType st : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (int64_t C : {64, 2048, 3000}) {  // 3000: a row that is not a multiple of the block
      at::manual_seed(C);
      const auto o = at::TensorOptions().dtype(st).device(cuda);
      const at::Tensor x = at::randn({3, 5, C}, o), r = at::randn({3, 5, C}, o) * 4, w = at::randn({C}, o);
      auto [s, y] = add_rms_norm(x, r, w, 1e-6);
      EXPECT_TRUE(at::equal(s, x + r)) << st << " C=" << C;
      const at::Tensor ref = fused_ops_ref_norm(x + r, w, 1e-6).to(at::kFloat);
      const double ulp = st == at::kBFloat16 ? 1.0 / 128 : st == at::kHalf ? 1.0 / 1024 : 1e-6;
      // Each element within one rounding of its reference (relative, plus the weight's product).
      const at::Tensor err = (y.to(at::kFloat) - ref).abs() - (ref.abs() * ulp + 1e-6);
      EXPECT_LE(err.max().item<double>(), 0.0) << st << " C=" << C;
      auto [s0, y0] = add_rms_norm(x, at::Tensor(), w, 1e-6);
      EXPECT_TRUE(at::equal(s0, x));
      EXPECT_LE(((y0.to(at::kFloat) - fused_ops_ref_norm(x, w, 1e-6).to(at::kFloat)).abs() -
                 (fused_ops_ref_norm(x, w, 1e-6).to(at::kFloat).abs() * ulp + 1e-6))
                    .max()
                    .item<double>(),
                0.0)
          << st << " C=" << C;
      const at::Tensor g = at::randn({7, C}, o) * 3, u = at::randn({7, C}, o);
      EXPECT_TRUE(at::equal(silu_mul(g, u), at::silu(g) * u)) << st << " C=" << C;
    }
  }
  // Autograd recording keeps the reference ops (no backward in the kernels).
  const at::Tensor xg = at::randn({2, 64}, at::TensorOptions().device(cuda)).requires_grad_(true);
  const at::Tensor wg = at::randn({64}, at::TensorOptions().device(cuda));
  auto [sg, yg] = add_rms_norm(xg, at::Tensor(), wg, 1e-6);
  EXPECT_TRUE(yg.requires_grad());
}
