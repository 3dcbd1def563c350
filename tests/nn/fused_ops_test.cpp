// nn::add_rms_norm and nn::silu_mul (nn/fused_ops.h): on the CPU the fp32 norm is one loop within
// rounding of the reference ops (exactly them when switched off), silu · up the reference; on CUDA with HEARTH_WITH_CUDA_KERNELS the fused
// kernels (kernels/norm_act.cu) against those same ops on the same device — the sum and silu_mul
// bit-identical, the norm within one rounding of the dtype; nn::rope_cache_write (kernels/
// rope_cache.cu) against nn::apply_rotary + StaticKVCache::update, bit-identical; nn::fused_rotary
// against apply_rotary's tensor ops, bit-identical (on the CPU in fp32 too). The CUDA tests
// skip without a GPU.
#include <gtest/gtest.h>

#include <thread>

#include "cache/static_kv_cache.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "nn/fused_ops.h"
#include "nn/rms_norm.h"
#include "nn/rope.h"

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

// On the CPU: fp32 norms take one loop (nn/fused_ops_cpu.h) — the sum bit-identical, y within two
// fp32 roundings of the reference (its sum of squares in double, the reference's in fp32) — and
// the reference ops exactly when switched off, in fp64, or while autograd records.
TEST(FusedOps, CpuNormIsTheReferenceWithinRoundingAndExactlyWhenOff) {
  FusedOpsSwitch on(true);
  at::manual_seed(3);
  const at::Tensor x = at::randn({2, 3, 40}), r = at::randn({2, 3, 40}) * 4, w = at::randn({40});
  auto within = [](const at::Tensor& got, const at::Tensor& want) {
    return ((got - want).abs() - want.abs() * 2.5e-7 - 1e-30).max().item<double>() <= 0.0;
  };
  auto [s, y] = add_rms_norm(x, r, w, 1e-5);
  EXPECT_TRUE(at::equal(s, x + r));
  EXPECT_TRUE(within(y, fused_ops_ref_norm(x + r, w, 1e-5)));
  auto [s0, y0] = add_rms_norm(x, at::Tensor(), w, 1e-5);
  EXPECT_TRUE(at::equal(s0, x));
  EXPECT_TRUE(within(y0, fused_ops_ref_norm(x, w, 1e-5)));
  hearth::nn::RMSNorm norm(w, 1e-5);
  EXPECT_TRUE(at::equal(norm.forward_add(x, r).second, norm.forward(x + r)));  // the same loop either way
  {
    const hearth::nn::FusedDecodeOff off;
    EXPECT_TRUE(at::equal(add_rms_norm(x, r, w, 1e-5).second, fused_ops_ref_norm(x + r, w, 1e-5)));
  }
  const at::Tensor xd = x.to(at::kDouble), wd = w.to(at::kDouble);
  EXPECT_TRUE(at::equal(add_rms_norm(xd, at::Tensor(), wd, 1e-5).second, fused_ops_ref_norm(xd, wd, 1e-5)));
  const at::Tensor xg = x.clone().requires_grad_(true);
  EXPECT_TRUE(add_rms_norm(xg, at::Tensor(), w, 1e-5).second.requires_grad());
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

// Prompt-sized row counts take the norm kernel that stages rows through shared memory
// (kernels/norm_act.cu, from 16 rows); decode's few rows the register kernel. Both sum each row in
// the same order: 40 rows at once are bit-identical to the same rows 8 at a time, for every dtype,
// row lengths whose vectors divide them or not (3000 bf16: the register kernel throughout), with
// the residual add, the gate and the added residual of the family norms.
TEST(FusedOps, CudaNormOfManyRowsIsTheNormOfFewRows) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
#ifndef HEARTH_WITH_CUDA_KERNELS
  GTEST_SKIP() << "built without Hearth's CUDA kernels";
#endif
  FusedOpsSwitch on(true);
  const at::Device cuda(at::kCUDA, 0);
  using hearth::nn::NormScale;
  for (at::ScalarType st : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (int64_t C : {64, 2048, 3000, 4096, 8192}) {
      at::manual_seed(C);
      const auto o = at::TensorOptions().dtype(st).device(cuda);
      const at::Tensor x = at::randn({40, C}, o), r = at::randn({40, C}, o) * 4, w = at::randn({C}, o);
      const at::Tensor g = at::randn({40, C}, o) * 3;
      auto [s, y] = add_rms_norm(x, r, w, 1e-6);
      const at::Tensor yg = hearth::nn::fused_rms_norm(x, w, 1e-6, NormScale::kAfterRound, 0.0, g);
      const at::Tensor ya = hearth::nn::fused_rms_norm(x, w, 1e-6, NormScale::kFp32, 1.0, {}, r);
      ASSERT_TRUE(yg.defined() && ya.defined());
      for (int64_t i = 0; i < 40; i += 8) {
        const std::string what = std::string(c10::toString(st)) + " C=" + std::to_string(C) + " rows " + std::to_string(i);
        auto [s8, y8] = add_rms_norm(x.narrow(0, i, 8), r.narrow(0, i, 8), w, 1e-6);
        EXPECT_TRUE(at::equal(s8, s.narrow(0, i, 8))) << what;
        EXPECT_TRUE(at::equal(y8, y.narrow(0, i, 8))) << what;
        EXPECT_TRUE(at::equal(hearth::nn::fused_rms_norm(x.narrow(0, i, 8), w, 1e-6, NormScale::kAfterRound, 0.0,
                                                         g.narrow(0, i, 8)),
                              yg.narrow(0, i, 8)))
            << what << " gated";
        EXPECT_TRUE(at::equal(hearth::nn::fused_rms_norm(x.narrow(0, i, 8), w, 1e-6, NormScale::kFp32, 1.0, {},
                                                         r.narrow(0, i, 8)),
                              ya.narrow(0, i, 8)))
            << what << " + residual";
      }
    }
  }
}

namespace {

// One static-step write done both ways on the same data: returns {fused q, reference q} after
// checking the two pools agree (keys and values, every position).
std::pair<at::Tensor, at::Tensor> fused_ops_rope_both(at::ScalarType st, at::Device dev, int64_t Hq, int64_t Hk,
                                                      int64_t D, int64_t rot) {
  const int64_t B = 3, S = 16, C = 20;
  const auto o = at::TensorOptions().dtype(st).device(dev);
  auto state = std::make_shared<hearth::cache::StaticState>();
  state->positions = at::tensor(std::vector<int64_t>{5, 0, 15}, at::kLong).to(dev);
  state->capacity = S;
  const at::Tensor pk = at::randn({4, Hk, C, D}, o), pv = at::randn({4, Hk, C, D}, o);
  at::Tensor ref_k = pk.clone(), ref_v = pv.clone(), fused_k = pk.clone(), fused_v = pv.clone();
  hearth::cache::StaticKVCache ref(state, ref_k, ref_v), fused(state, fused_k, fused_v);
  // Strided like a projection's output viewed [B, 1, H, D] and transposed to [B, H, 1, D].
  const at::Tensor q = at::randn({B, 1, Hq, D}, o).transpose(1, 2), k = at::randn({B, 1, Hk, D}, o).transpose(1, 2);
  const at::Tensor v = at::randn({B, 1, Hk, D}, o).transpose(1, 2);
  const at::Tensor table_cos = at::randn({S, rot}, o), table_sin = at::randn({S, rot}, o);
  const at::Tensor cos = table_cos.index_select(0, state->positions).view({B, 1, 1, rot});
  const at::Tensor sin = table_sin.index_select(0, state->positions).view({B, 1, 1, rot});
  at::Tensor want_q;
  {
    const hearth::nn::FusedDecodeOff tensor_ops;  // the reference: apply_rotary's tensor ops
    want_q = hearth::nn::apply_rotary(q, cos, sin);
    ref.update(hearth::nn::apply_rotary(k, cos, sin), v);
  }
  const at::Tensor got_q = hearth::nn::rope_cache_write(q, k, v, cos, sin, state->positions, fused.flat_keys(),
                                                        fused.flat_values(), fused.row_stride());
  if (got_q.defined()) {
    EXPECT_TRUE(at::equal(fused_k, ref_k)) << c10::toString(st) << " Hq " << Hq << " Hk " << Hk << " D " << D;
    EXPECT_TRUE(at::equal(fused_v, ref_v)) << c10::toString(st) << " Hq " << Hq << " Hk " << Hk << " D " << D;
  } else {
    EXPECT_TRUE(at::equal(fused_k, pk)) << "no kernel: nothing written";
  }
  return {got_q, want_q};
}

}  // namespace

TEST(FusedOps, RopeCacheWriteIsApplyRotaryAndUpdate) {
  {  // the CPU (and the switch off) leave it to the tensor ops: undefined, nothing written
    FusedOpsSwitch on(true);
    EXPECT_FALSE(fused_ops_rope_both(at::kFloat, at::kCPU, 4, 2, 8, 8).first.defined());
  }
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
#ifndef HEARTH_WITH_CUDA_KERNELS
  GTEST_SKIP() << "built without Hearth's CUDA kernels";
#endif
  const at::Device cuda(at::kCUDA, 0);
  {
    FusedOpsSwitch off(false);
    EXPECT_FALSE(fused_ops_rope_both(at::kBFloat16, cuda, 4, 2, 64, 64).first.defined());
  }
  FusedOpsSwitch on(true);
  struct Shape {
    int64_t Hq, Hk, D, rot;
  };
  // GQA 4:1 at D 64; MHA at D 128 with half the dims rotated; MQA at D 80 (not a power of two);
  // D 256 (Gemma-sized heads, more dims than threads).
  for (at::ScalarType st : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (Shape s : {Shape{8, 2, 64, 64}, Shape{4, 4, 128, 64}, Shape{6, 1, 80, 80}, Shape{2, 1, 256, 256}}) {
      at::manual_seed(s.D + s.Hq);
      auto [got, want] = fused_ops_rope_both(st, cuda, s.Hq, s.Hk, s.D, s.rot);
      ASSERT_TRUE(got.defined()) << c10::toString(st) << " D " << s.D;
      EXPECT_EQ(got.sizes(), want.sizes());
      EXPECT_TRUE(at::equal(got, want)) << c10::toString(st) << " Hq " << s.Hq << " D " << s.D << " rot " << s.rot
                                        << ": max |d| " << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
    }
  }
}

TEST(FusedOps, FusedRotaryIsApplyRotarysTensorOps) {
  {  // the CPU: fp32 takes one loop, bit-identical (strided x, per-row and partial tables); fp64 not
    FusedOpsSwitch on(true);
    at::manual_seed(8);
    const at::Tensor x = at::randn({2, 5, 3, 8}).transpose(1, 2);  // [B, H, T, D] over [B, T, H, D]
    const std::vector<std::pair<at::Tensor, at::Tensor>> tables = {
        {at::randn({5, 8}), at::randn({5, 8})}, {at::randn({2, 1, 5, 8}), at::randn({2, 1, 5, 8})},
        {at::randn({5, 4}), at::randn({5, 4})}, {at::randn({2, 1, 1, 8}), at::randn({2, 1, 1, 8})}};
    for (size_t i = 0; i < tables.size(); ++i) {
      const auto& [cos, sin] = tables[i];
      const at::Tensor xi = i == 3 ? x.narrow(2, 0, 1) : x;
      at::Tensor want;
      {
        const hearth::nn::FusedDecodeOff tensor_ops;
        want = hearth::nn::apply_rotary(xi, cos, sin);
      }
      const at::Tensor got = hearth::nn::fused_rotary(xi, cos, sin);
      ASSERT_TRUE(got.defined()) << "table " << i;
      EXPECT_TRUE(at::equal(got, want)) << "table " << i;
      EXPECT_EQ(got.strides(), want.strides()) << "table " << i;  // the layout later ops check
      EXPECT_TRUE(at::equal(hearth::nn::apply_rotary(xi, cos, sin), want)) << "table " << i;
    }
    // A decode step's q: [B, 1, H, D] projections seen as [B, H, 1, D] come out contiguous (the CPU
    // decode attention takes only that layout; x's own strides had sent a batch down a slow path).
    const at::Tensor q1 = at::randn({3, 1, 5, 8}).transpose(1, 2);
    const at::Tensor rows_cos = at::randn({3, 1, 1, 8}), rows_sin = at::randn({3, 1, 1, 8});
    const at::Tensor r1 = hearth::nn::fused_rotary(q1, rows_cos, rows_sin);
    ASSERT_TRUE(r1.defined());
    EXPECT_EQ(r1.stride(2), 8);
    EXPECT_EQ(r1.stride(1), 8);
    EXPECT_FALSE(hearth::nn::fused_rotary(x.to(at::kDouble), tables[0].first.to(at::kDouble),
                                          tables[0].second.to(at::kDouble))
                     .defined());
    const hearth::nn::FusedDecodeOff off;
    EXPECT_FALSE(hearth::nn::fused_rotary(x, tables[0].first, tables[0].second).defined());
  }
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
#ifndef HEARTH_WITH_CUDA_KERNELS
  GTEST_SKIP() << "built without Hearth's CUDA kernels";
#endif
  const at::Device cuda(at::kCUDA, 0);
  FusedOpsSwitch on(true);
  struct Case {
    int64_t B, T, H, D, rot;
    int table;  // 0: cos [T, rot]; 1: [B, 1, T, rot]; 2: [1, 1, T, rot]; 3: [B, 1, 1, rot] (T = 1)
  };
  // A prompt chunk of GQA q heads; k heads at D 128 half rotated; per-row tables (decode rows and
  // batched prefill); one token per row; Gemma-sized heads (D 256 and 512, more dims than threads).
  const std::vector<Case> cases = {{1, 37, 8, 64, 64, 0}, {2, 5, 2, 128, 64, 0}, {3, 4, 4, 64, 64, 1},
                                   {2, 6, 3, 80, 80, 2},  {5, 1, 4, 64, 64, 3},  {1, 9, 2, 256, 256, 0},
                                   {1, 3, 1, 512, 128, 0}};
  for (at::ScalarType st : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const auto o = at::TensorOptions().dtype(st).device(cuda);
    for (const Case& c : cases) {
      at::manual_seed(c.D * 7 + c.T);
      // [B, T, H, D] projections viewed [B, H, T, D], as the attention modules make them.
      const at::Tensor x = at::randn({c.B, c.T, c.H, c.D}, o).transpose(1, 2);
      std::vector<int64_t> shape;
      switch (c.table) {
        case 0: shape = {c.T, c.rot}; break;
        case 1: shape = {c.B, 1, c.T, c.rot}; break;
        case 2: shape = {1, 1, c.T, c.rot}; break;
        default: shape = {c.B, 1, 1, c.rot}; break;
      }
      const at::Tensor cos = at::randn(shape, o), sin = at::randn(shape, o);
      at::Tensor want;
      {
        const hearth::nn::FusedDecodeOff tensor_ops;
        want = hearth::nn::apply_rotary(x, cos, sin);
      }
      const at::Tensor got = hearth::nn::fused_rotary(x, cos, sin);
      ASSERT_TRUE(got.defined()) << c10::toString(st) << " D " << c.D << " table " << c.table;
      EXPECT_EQ(got.sizes(), want.sizes());
      EXPECT_TRUE(at::equal(got, want)) << c10::toString(st) << " B " << c.B << " T " << c.T << " D " << c.D
                                        << " rot " << c.rot << " table " << c.table << ": max |d| "
                                        << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
      EXPECT_TRUE(at::equal(hearth::nn::apply_rotary(x, cos, sin), want));  // apply_rotary takes the kernel
    }
  }
  // Not for the kernel: an odd rotated width, mixed dtypes, a table per head.
  const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(cuda);
  const at::Tensor x = at::randn({1, 2, 3, 8}, bf);
  EXPECT_FALSE(hearth::nn::fused_rotary(x, at::randn({3, 7}, bf), at::randn({3, 7}, bf)).defined());
  EXPECT_FALSE(hearth::nn::fused_rotary(x, at::randn({3, 8}, bf.dtype(at::kFloat)), at::randn({3, 8}, bf.dtype(at::kFloat))).defined());
  EXPECT_FALSE(hearth::nn::fused_rotary(x, at::randn({1, 2, 3, 8}, bf), at::randn({1, 2, 3, 8}, bf)).defined());
}

TEST(FusedOps, FusedDecodeOffScopesTheCallingThreadOnly) {
  const bool was = hearth::nn::set_fused_decode(true);
  EXPECT_TRUE(hearth::nn::fused_decode_enabled());
  {
    const hearth::nn::FusedDecodeOff off;
    EXPECT_FALSE(hearth::nn::fused_decode_enabled());
    {
      const hearth::nn::FusedDecodeOff nested;
      EXPECT_FALSE(hearth::nn::fused_decode_enabled());
    }
    EXPECT_FALSE(hearth::nn::fused_decode_enabled());  // the outer scope still holds
    bool other = false;
    std::thread t([&] { other = hearth::nn::fused_decode_enabled(); });
    t.join();
    EXPECT_TRUE(other);  // another thread keeps the process-wide setting
  }
  EXPECT_TRUE(hearth::nn::fused_decode_enabled());
  hearth::nn::set_fused_decode(was);
}
