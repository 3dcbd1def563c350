// Tests for the fused cross-entropy kernel (kernels/cross_entropy.cu): its launcher against the
// fp32 log-softmax reference on the same device, and train::chunked_cross_entropy_vjp on CUDA (which
// dispatches to it) against the same call on the CPU. Skipped without CUDA (this machine's CPU
// build); run on the GPU machine.
#include <gtest/gtest.h>

#include "core/torch_compat.h"
#include "train/loss.h"

#ifdef HEARTH_WITH_CUDA_KERNELS
#include "kernels/cross_entropy.h"
#endif

namespace {

// max |a - b| relative to max |b| (b the reference), both moved to fp32 on the CPU.
double ce_rel_err(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor bf = b.to(at::kCPU).to(at::kFloat);
  const double s = std::max(bf.abs().max().item<double>(), 1e-30);
  return (a.to(at::kCPU).to(at::kFloat) - bf).abs().max().item<double>() / s;
}

}  // namespace

// The loss head on CUDA (fused kernel where built) equals the CPU autograd reference: loss, the
// hidden gradient and a head weight's gradient, fp32, with ignored positions and uneven chunks.
TEST(CrossEntropyCuda, ChunkedVjpMatchesCpuReference) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
  at::manual_seed(31);
  const at::Device cuda(at::kCUDA, 0);
  const int64_t B = 2, T = 37, C = 24, V = 1000;
  const at::Tensor hidden = at::randn({B, T, C});
  const at::Tensor w = at::randn({V, C}) * 0.3;
  at::Tensor targets = at::randint(0, V, {B, T}, at::kLong);
  targets.index_put_({0, at::indexing::Slice(0, 5)}, hearth::train::kIgnoreIndex);
  targets.index_put_({1, T - 1}, hearth::train::kIgnoreIndex);
  auto run = [&](const at::Device& d, at::Tensor& w_grad) {
    at::Tensor wd = w.to(d).requires_grad_(true);
    auto head = [&](const at::Tensor& h) { return at::matmul(h, wd.t()); };
    hearth::train::HeadVjp r =
        hearth::train::chunked_cross_entropy_vjp(hidden.to(d), targets, head, /*chunk=*/16, /*scale=*/0.25, {wd});
    w_grad = wd.grad().to(at::kCPU);
    return r;
  };
  at::Tensor wg_cpu, wg_cuda;
  const hearth::train::HeadVjp ref = run(at::kCPU, wg_cpu);
  const hearth::train::HeadVjp got = run(cuda, wg_cuda);
  EXPECT_EQ(got.n_tokens, ref.n_tokens);
  EXPECT_NEAR(got.loss_sum, ref.loss_sum, 1e-5 * std::abs(ref.loss_sum));
  EXPECT_LE(ce_rel_err(got.grad_hidden, ref.grad_hidden), 1e-5);
  EXPECT_LE(ce_rel_err(wg_cuda, wg_cpu), 1e-5);
  // Ignored positions get exactly zero gradient.
  EXPECT_EQ(got.grad_hidden.to(at::kCPU).select(0, 0).narrow(0, 0, 5).abs().max().item<float>(), 0.f);
}

#ifdef HEARTH_WITH_CUDA_KERNELS
// The launcher itself (so a silent fallback in chunked_cross_entropy_vjp cannot pass for the
// kernel): fp32/fp16/bf16, a vocabulary that takes 16-byte loads and one that does not.
TEST(CrossEntropyCuda, LauncherMatchesLogSoftmaxReference) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
  namespace k = hearth::kernels;
  at::manual_seed(32);
  const at::Device cuda(at::kCUDA, 0);
  for (at::ScalarType st : {at::kFloat, at::kHalf, at::kBFloat16})
    for (int64_t V : {32000, 1001, 8}) {
      const int64_t N = 19;
      const float scale = 0.125f;
      const at::Tensor x = (at::randn({N, V}) * 4).to(st).to(cuda);
      at::Tensor t = at::randint(0, V, {N}, at::kLong);
      t[3] = hearth::train::kIgnoreIndex;
      t[7] = V - 1;
      t = t.to(cuda);
      at::Tensor rows = at::full({N}, 7.f, x.options().dtype(at::kFloat));
      at::Tensor g = at::full({N, V}, 7.0, x.options());
      k::CrossEntropyArgs a;
      a.logits = x.data_ptr();
      a.dtype = st == at::kBFloat16 ? k::QDtype::kBFloat16 : st == at::kHalf ? k::QDtype::kFloat16 : k::QDtype::kFloat32;
      a.targets = t.data_ptr<int64_t>();
      a.scale = scale;
      a.loss_rows = rows.data_ptr<float>();
      a.grad = g.data_ptr();
      a.N = N;
      a.V = V;
      const char* err = k::cross_entropy_fwd_bwd(a);  // legacy default stream, as torch's current one here
      ASSERT_EQ(err, nullptr) << err;
      hearth::compat::synchronize(cuda);
      // Reference: fp32 log-softmax of the same (rounded) logits.
      const at::Tensor xf = x.to(at::kFloat);
      const at::Tensor keep = t.ne(hearth::train::kIgnoreIndex);
      const at::Tensor lse = at::logsumexp(xf, -1);
      const at::Tensor picked = xf.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1);
      const at::Tensor loss_ref = at::where(keep, lse - picked, at::zeros_like(lse));
      at::Tensor grad_ref = at::softmax(xf, -1);
      grad_ref.scatter_add_(1, t.clamp_min(0).unsqueeze(1), at::full({N, 1}, -1.f, grad_ref.options()));
      grad_ref = (grad_ref * scale * keep.unsqueeze(1).to(at::kFloat)).to(st).to(at::kFloat);
      EXPECT_LE(ce_rel_err(rows, loss_ref), 2e-6) << st << " V " << V;
      // One rounding to the dtype in both: at most one ulp apart where the fp32 values straddle a
      // rounding boundary (2^-8 relative for bf16, 2^-11 for fp16), relative to the largest entry.
      const double tol = st == at::kFloat ? 2e-6 : st == at::kHalf ? 1e-3 : 8e-3;
      EXPECT_LE(ce_rel_err(g, grad_ref), tol) << st << " V " << V;
      EXPECT_EQ(g[3].abs().max().item<float>(), 0.f);
    }
  k::CrossEntropyArgs bad;
  bad.N = 3;
  bad.V = 0;
  EXPECT_NE(k::cross_entropy_fwd_bwd(bad), nullptr);
}
#endif
