// Tests for the RMSNorm run inside the decode GEMV launch (nn/decode_gemv.h decode_gemv_normed,
// Linear::forward_many_normed, GatedMLP::forward_normed): the same bits as the norm kernel followed
// by the GEMV (their promise), the fallback everywhere else. CUDA cases are skipped on this CPU
// build; they run on the GPU machine.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/torch_compat.h"
#include "nn/decode_gemv.h"
#include "cuda_kernel_test_util.h"
#include "nn/fused_ops.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/quant.h"
#include "nn/rms_norm.h"

namespace {

// Dynamic shared memory the normed launch needs (kernels/gemv.h: the normed rows as padded fp32, and
// the affine chunk sums) against its 48 KB - 512 bytes: whether decode_gemv_normed must apply.
bool dgn_fits(int bits, at::ScalarType dt, int64_t M, int64_t in) {
  const int64_t codes = bits == 0 ? (dt == at::kFloat ? 4 : 8) : 128 / bits, chunks = in / codes;
  const int64_t sums = bits == 0 ? 0 : (M * chunks * 4 + 15) / 16 * 16;
  return sums + M * chunks * (codes + 4) * 4 <= 48 * 1024 - 512;
}


// An operand's weight as a dense [out, in] matrix.
at::Tensor dgn_dense(const hearth::nn::GemvOperand& o) {
  return o.quant ? hearth::nn::dequantize(*o.quant, at::kFloat) : o.dense.to(at::kFloat);
}

}  // namespace

TEST(DecodeGemvNormed, FallsBackOnCpuToTheNormThenTheProducts) {
  at::manual_seed(5);
  const at::Tensor x = at::randn({1, 1, 64}), r = at::randn({1, 1, 64});
  const hearth::nn::RMSNorm norm(at::rand({64}) + 0.5, 1e-5);
  const hearth::nn::Linear a(at::randn({32, 64})), b(at::randn({16, 64}));
  EXPECT_TRUE(hearth::nn::decode_gemv_normed(x, r, norm.weight(), 1e-5, {{a.weight(), nullptr}}).ys.empty());
  const hearth::nn::Linear::NormedProducts p = hearth::nn::Linear::forward_many_normed({x, r, &norm}, {&a, &b});
  const auto [sum, normed] = norm.forward_add(x, r);
  EXPECT_TRUE(at::equal(p.sum, sum));
  EXPECT_TRUE(at::equal(p.normed, normed));
  ASSERT_EQ(p.ys.size(), 2u);
  EXPECT_TRUE(at::equal(p.ys[0], a.forward(normed)));
  EXPECT_TRUE(at::equal(p.ys[1], b.forward(normed)));
  EXPECT_EQ(p.ys[1].sizes().vec(), (std::vector<int64_t>{1, 1, 16}));
  // Without a residual the sum is x itself.
  const hearth::nn::Linear::NormedProducts q = hearth::nn::Linear::forward_many_normed({x, at::Tensor(), &norm}, {&a});
  EXPECT_TRUE(at::equal(q.sum, x));
  EXPECT_TRUE(at::equal(q.ys[0], a.forward(norm.forward(x))));
}

TEST(DecodeGemvNormed, MlpForwardNormedIsTheNormThenTheMlp) {
  at::manual_seed(6);
  const at::Tensor x = at::randn({2, 3, 32}), r = at::randn({2, 3, 32});
  const hearth::nn::RMSNorm norm(at::rand({32}) + 0.5, 1e-6);
  hearth::nn::GatedMLP mlp;
  mlp.gate_proj = hearth::nn::Linear(at::randn({48, 32}) * 0.1);
  mlp.up_proj = hearth::nn::Linear(at::randn({48, 32}) * 0.1);
  mlp.down_proj = hearth::nn::Linear(at::randn({32, 48}) * 0.1);
  const auto [sum, out] = mlp.forward_normed({x, r, &norm});
  const auto [s2, n2] = norm.forward_add(x, r);
  EXPECT_TRUE(at::equal(sum, s2));
  EXPECT_TRUE(at::equal(out, mlp.forward(n2)));
}

// The promise: sum and normed equal, bit for bit, what add_rms_norm's kernel gives, and every
// product decode_gemv's of normed within summation order and an fp64 reference — dense bf16/f16/fp32 and MLX affine 4/8-bit, M = 1 and 3, with and without a
// residual, one to three segments, rows of 2,048 and 4,096 (the 1B's and the 8B's hidden sizes), 64
// and 1,000 (not a multiple of the 256 threads).
TEST(DecodeGemvNormed, GpuSameBitsAsNormKernelThenGemv) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's kernels (GPU machine)";
  hearth::testing::FusedDecodeSwitch on(true);
  at::manual_seed(41);
  const at::Device cuda(at::kCUDA, 0);
  int fused_cases = 0;
  for (int bits : {0, 4, 8})
    for (auto dt : {at::kBFloat16, at::kHalf, at::kFloat})
      for (int64_t in : {64, 1000, 1024, 2048, 4096})
        for (int64_t M : {1, 3})
          for (bool with_res : {true, false}) {
            if (bits != 0 && in % 64 != 0) continue;  // whole quantization groups
            const at::Tensor x = (at::randn({M, 1, in}) * 2).to(dt).to(cuda);
            const at::Tensor r = with_res ? at::randn({M, 1, in}).to(dt).to(cuda) : at::Tensor();
            const at::Tensor w = (at::rand({in}) + 0.5).to(dt).to(cuda);
            std::vector<hearth::nn::QuantizedWeight> qs;
            std::vector<at::Tensor> ds;
            std::vector<hearth::nn::GemvOperand> ops;
            for (int64_t out : {96, 32, 256}) {
              const at::Tensor m = at::randn({out, in}) * 0.05;
              if (bits == 0) {
                ds.push_back(m.to(dt).to(cuda));
              } else {
                hearth::nn::QuantizedWeight q = hearth::nn::quantize(m, hearth::nn::QuantSpec{bits, 64});
                qs.push_back(hearth::nn::QuantizedWeight{q.wq.to(cuda), q.scales.to(dt).to(cuda),
                                                         q.biases.to(dt).to(cuda), q.spec});
              }
            }
            for (size_t i = 0; i < 3; ++i)
              ops.push_back(bits == 0 ? hearth::nn::GemvOperand{ds[i], nullptr} : hearth::nn::GemvOperand{{}, &qs[i]});
            const std::string what = "bits " + std::to_string(bits) + " " + std::string(c10::toString(dt)) + " in " +
                                     std::to_string(in) + " M " + std::to_string(M) + (with_res ? " +res" : "");
            for (size_t n = 1; n <= 3; ++n) {
              const std::vector<hearth::nn::GemvOperand> some(ops.begin(), ops.begin() + static_cast<std::ptrdiff_t>(n));
              const hearth::nn::NormedGemv g = hearth::nn::decode_gemv_normed(x, r, w, 1e-5, some);
              if (!dgn_fits(bits, dt, M, in)) {  // e.g. M = 3 rows of 4,096, or of 2,048 in fp32
                EXPECT_TRUE(g.ys.empty()) << what << ": the normed rows do not fit shared memory";
                continue;
              }
              ASSERT_EQ(g.ys.size(), n) << what;
              ++fused_cases;
              const auto [sum, normed] = hearth::nn::add_rms_norm(x, r, w, 1e-5);
              EXPECT_TRUE(at::equal(g.sum, sum)) << what;
              EXPECT_TRUE(at::equal(g.normed, normed)) << what;
              const std::vector<at::Tensor> ref = hearth::nn::decode_gemv(normed, some);
              ASSERT_EQ(ref.size(), n) << what;
              for (size_t i = 0; i < n; ++i) {  // a normed launch may sum a row in another order
                EXPECT_EQ(g.ys[i].sizes(), ref[i].sizes()) << what;
                EXPECT_LE(hearth::testing::max_rel_err(g.ys[i], ref[i]), dt == at::kFloat ? 1e-5 : 1e-2) << what << " segment " << i;
                const at::Tensor exact = at::matmul(normed.to(at::kDouble), dgn_dense(some[i]).to(at::kDouble).t());
                EXPECT_LE(hearth::testing::max_rel_err(g.ys[i], exact), dt == at::kFloat ? 1e-5 : dt == at::kHalf ? 2e-3 : 1e-2) << what;
              }
            }
          }
  EXPECT_EQ(fused_cases, 408);  // every case that fits (dgn_fits) took the fused launch
}

// Through the modules: forward_many_normed on CUDA takes the fused launch (one row: the same values
// as the norm then forward_many, within summation order) and the fallback (cuBLAS rows: the same
// bits); active adapters are added from the normed input.
TEST(DecodeGemvNormed, GpuLinearAndMlpMatchTheUnfusedModules) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's kernels (GPU machine)";
  hearth::testing::FusedDecodeSwitch on(true);
  at::manual_seed(43);
  const at::Device cuda(at::kCUDA, 0);
  const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(cuda);
  const hearth::nn::RMSNorm norm((at::rand({512}) + 0.5).to(bf), 1e-5);
  hearth::nn::GatedMLP mlp;
  mlp.gate_proj = hearth::nn::Linear((at::randn({1024, 512}) * 0.05).to(bf));
  mlp.up_proj = hearth::nn::Linear((at::randn({1024, 512}) * 0.05).to(bf));
  mlp.down_proj = hearth::nn::Linear((at::randn({512, 1024}) * 0.05).to(bf));
  hearth::nn::LoraAdapter ad{(at::randn({4, 512}) * 0.1).to(bf), (at::randn({1024, 4}) * 0.1).to(bf), 2.0, 0.0};
  mlp.up_proj.add_adapter("a", ad);
  for (int64_t B : {1, 4}) {
    const at::Tensor x = at::randn({B, 1, 512}).to(bf), r = at::randn({B, 1, 512}).to(bf);
    for (bool adapter : {false, true}) {
      std::optional<hearth::nn::ActiveAdapters> scope;
      if (adapter) scope.emplace(std::vector<std::string>{"a"});
      const auto [sum, out] = mlp.forward_normed({x, r, &norm});
      const auto [s2, n2] = norm.forward_add(x, r);
      EXPECT_TRUE(at::equal(sum, s2)) << "B " << B << " adapter " << adapter;
      EXPECT_LE(hearth::testing::max_rel_err(out, mlp.forward(n2)), 2e-2) << "B " << B << " adapter " << adapter;
      const hearth::nn::Linear::NormedProducts p =
          hearth::nn::Linear::forward_many_normed({x, r, &norm}, {&mlp.gate_proj, &mlp.up_proj});
      EXPECT_TRUE(at::equal(p.normed, n2));
      const std::vector<at::Tensor> ref = hearth::nn::Linear::forward_many(n2, {&mlp.gate_proj, &mlp.up_proj});
      EXPECT_LE(hearth::testing::max_rel_err(p.ys[0], ref[0]), 1e-2) << "B " << B << " adapter " << adapter;
      EXPECT_LE(hearth::testing::max_rel_err(p.ys[1], ref[1]), 1e-2) << "B " << B << " adapter " << adapter;
      if (B > 1) {
        EXPECT_TRUE(at::equal(p.ys[1], ref[1])) << "cuBLAS rows take the unfused path";
      }
    }
  }
}
