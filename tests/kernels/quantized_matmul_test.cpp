// Tests for the fused CUDA quantized GEMV (kernels/quantized_matmul.cu): called directly through its
// launcher and through nn::quantized_matmul, against the fp32 dequantize + matmul reference on the
// same device. Skipped without CUDA (this machine's CPU build); run on the GPU machine.
#include <gtest/gtest.h>

#include "core/torch_compat.h"
#include "nn/quant.h"

#ifdef HEARTH_WITH_CUDA_KERNELS
#include "kernels/quantized_matmul.h"
#endif

using hearth::nn::QuantizedWeight;
using hearth::nn::QuantSpec;

namespace {

// Quantizes random weights on the CPU (with the extreme codes in rows 0 and 1), then moves the
// triple to the GPU with scales/biases in `sdt`.
QuantizedWeight make_weight(int64_t out, int64_t in, int bits, int gs, at::ScalarType sdt) {
  QuantizedWeight q = hearth::nn::quantize(at::randn({out, in}), QuantSpec{bits, gs});
  at::Tensor codes = at::randint(0, 1 << bits, {out, in}, at::kLong);
  codes[0].fill_((1 << bits) - 1);
  codes[1].fill_(0);
  q.wq = hearth::nn::pack_codes(codes, bits);
  const at::Device cuda(at::kCUDA, 0);
  return QuantizedWeight{q.wq.to(cuda), q.scales.to(sdt).to(cuda), q.biases.to(sdt).to(cuda), q.spec};
}

// max |y - ref| relative to max |ref|, with y and ref on the GPU.
double rel_err(const at::Tensor& y, const at::Tensor& ref) {
  const double scale = ref.abs().max().item<double>();
  return (y.to(at::kFloat) - ref).abs().max().item<double>() / std::max(scale, 1e-30);
}

// Tolerance relative to the output's magnitude: fp32 sums in another order; bf16/f16 add one
// rounding of the output (2^-9 / 2^-12 relative) on top.
double tolerance(at::ScalarType t) { return t == at::kFloat ? 2e-5 : t == at::kHalf ? 2e-3 : 1e-2; }

}  // namespace

TEST(QuantizedMatmulCuda, MatchesFp32ReferenceThroughQuantizedMatmul) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
  at::manual_seed(21);
  const at::Device cuda(at::kCUDA, 0);
  for (int bits : {4, 8})
    for (int gs : {32, 64, 128})
      for (auto dt : {at::kBFloat16, at::kFloat})
        for (auto [out, in] : {std::pair<int64_t, int64_t>{37, 256}, {1000, 1024}, {16, 128}})
          for (int64_t M : {1, 2, 8}) {
            const QuantizedWeight q = make_weight(out, in, bits, gs, dt);
            const at::Tensor x = at::randn({M, in}).to(dt).to(cuda);
            const at::Tensor y = hearth::nn::quantized_matmul(x, q);
            const at::Tensor ref = hearth::nn::quantized_matmul_ref(x.to(at::kFloat), q);
            ASSERT_EQ(y.scalar_type(), dt);
            ASSERT_EQ(y.sizes().vec(), (std::vector<int64_t>{M, out}));
            EXPECT_LE(rel_err(y, ref), tolerance(dt))
                << "bits " << bits << " gs " << gs << " dtype " << dt << " [" << out << ", " << in << "] M " << M;
          }
}

TEST(QuantizedMatmulCuda, MixedDtypesAndBatchShapes) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
  at::manual_seed(22);
  const at::Device cuda(at::kCUDA, 0);
  // bf16 scales with fp32 x (scales go to fp32), fp32 scales with f16 x, and x [B, T, in].
  const QuantizedWeight qb = make_weight(300, 512, 4, 64, at::kBFloat16);
  const at::Tensor x32 = at::randn({2, 3, 512}).to(cuda);
  const at::Tensor y = hearth::nn::quantized_matmul(x32, qb);
  ASSERT_EQ(y.sizes().vec(), (std::vector<int64_t>{2, 3, 300}));
  EXPECT_LE(rel_err(y, hearth::nn::quantized_matmul_ref(x32, qb)), tolerance(at::kFloat));
  const QuantizedWeight qf = make_weight(300, 512, 8, 32, at::kFloat);
  const at::Tensor x16 = at::randn({1, 1, 512}).to(at::kHalf).to(cuda);
  const at::Tensor y16 = hearth::nn::quantized_matmul(x16, qf);
  EXPECT_EQ(y16.scalar_type(), at::kHalf);
  EXPECT_LE(rel_err(y16, hearth::nn::quantized_matmul_ref(x16.to(at::kFloat), qf)), tolerance(at::kHalf));
  // M > 8 and 3-bit weights take the dequantize + matmul path: same answers.
  const at::Tensor x9 = at::randn({9, 512}).to(cuda);
  EXPECT_LE(rel_err(hearth::nn::quantized_matmul(x9, qb), hearth::nn::quantized_matmul_ref(x9, qb)), 1e-5);
  const QuantizedWeight q3 = make_weight(64, 512, 3, 64, at::kFloat);
  const at::Tensor x1 = at::randn({1, 512}).to(cuda);
  EXPECT_LE(rel_err(hearth::nn::quantized_matmul(x1, q3), hearth::nn::quantized_matmul_ref(x1, q3)), 1e-5);
}

#ifdef HEARTH_WITH_CUDA_KERNELS
// The launcher itself (so a silent fallback in nn::quantized_matmul cannot pass for the kernel).
TEST(QuantizedMatmulCuda, LauncherMatchesReference) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
  namespace k = hearth::kernels;
  at::manual_seed(23);
  const at::Device cuda(at::kCUDA, 0);
  for (int bits : {4, 8})
    for (int gs : {32, 64, 128})
      for (int64_t M : {1, 2, 8}) {
        const int64_t out = 45, in = 384;
        const QuantizedWeight q = make_weight(out, in, bits, gs, at::kBFloat16);
        const at::Tensor x = at::randn({M, in}).to(at::kBFloat16).to(cuda);
        at::Tensor y = at::full({M, out}, 7.0, x.options());
        k::QuantGemvArgs a;
        a.x = x.data_ptr();
        a.x_dtype = k::QDtype::kBFloat16;
        a.wq = reinterpret_cast<const uint32_t*>(q.wq.data_ptr<int32_t>());
        a.scales = q.scales.data_ptr();
        a.biases = q.biases.data_ptr();
        a.s_dtype = k::QDtype::kBFloat16;
        a.y = y.data_ptr();
        a.M = M;
        a.out = out;
        a.in = in;
        a.bits = bits;
        a.group_size = gs;
        const char* err = k::quantized_gemv(a);  // legacy default stream, as torch's current one here
        ASSERT_EQ(err, nullptr) << err;
        hearth::compat::synchronize(cuda);
        EXPECT_LE(rel_err(y, hearth::nn::quantized_matmul_ref(x.to(at::kFloat), q)), tolerance(at::kBFloat16))
            << "bits " << bits << " gs " << gs << " M " << M;
      }
  // Unsupported cases are refused with a reason, not run.
  EXPECT_FALSE(k::quantized_gemv_supported(3, 64, 1, 256, k::QDtype::kFloat32, k::QDtype::kFloat32));
  EXPECT_FALSE(k::quantized_gemv_supported(4, 64, 9, 256, k::QDtype::kFloat32, k::QDtype::kFloat32));
  EXPECT_FALSE(k::quantized_gemv_supported(4, 64, 1, 256, k::QDtype::kFloat32, k::QDtype::kBFloat16));
  k::QuantGemvArgs bad;
  bad.bits = 3;
  EXPECT_NE(k::quantized_gemv(bad), nullptr);
}
#endif
