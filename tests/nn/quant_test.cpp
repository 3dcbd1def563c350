// Tests for nn/quant: MLX affine quantization (hand-computed examples from mlx's formula, packing
// layout checked against mlx's byte packing written out independently), error bounds, and the CPU
// quantized matmul against its dequantize+matmul reference.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/torch_compat.h"
#include "nn/fused_ops.h"
#include "nn/quant.h"
#include "nn/quant_simd.h"

using hearth::nn::QuantizedWeight;
using hearth::nn::QuantSpec;

namespace {

// mlx's byte packing for one row of codes (mlx/backend/cpu/quantized.cpp, `quantize`): power-of-two
// bits put 32/bits codes per uint32 (code k at bit k*bits); 3/5 bits put 8 codes in 3/5 bytes and 6
// bits puts 4 codes in 3 bytes, each pack a 64-bit value split into little-endian bytes.
std::vector<uint8_t> mlx_pack_bytes(const std::vector<int>& codes, int bits) {
  std::vector<uint8_t> out;
  const bool pow2 = (bits & (bits - 1)) == 0;
  const int per_pack = pow2 ? 32 / bits : (bits == 6 ? 4 : 8);
  const int bytes_per_pack = pow2 ? 4 : (bits == 5 ? 5 : 3);
  for (size_t p = 0; p < codes.size(); p += per_pack) {
    uint64_t v = 0;
    for (int k = 0; k < per_pack; ++k) v |= static_cast<uint64_t>(codes[p + k]) << (k * bits);
    for (int b = 0; b < bytes_per_pack; ++b) out.push_back(static_cast<uint8_t>((v >> (8 * b)) & 0xff));
  }
  return out;
}

// Runs `body` once per SIMD instruction set this CPU has (kNone: the portable kernels), with the
// kernel capped to it; restores the cap.
template <class F>
void for_each_isa(F body) {
  using hearth::nn::simd::Isa;
  const Isa best = hearth::nn::simd::active_isa();
  for (Isa isa : {Isa::kNone, Isa::kAvx2, Isa::kAvx512}) {
    if (static_cast<int>(isa) > static_cast<int>(best)) break;
    const Isa prev = hearth::nn::simd::set_isa_cap(isa);
    body(isa);
    hearth::nn::simd::set_isa_cap(prev);
  }
}
}  // namespace

TEST(Quant, PackMatchesMlxByteLayoutAndRoundTrips) {
  at::manual_seed(1);
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    at::Tensor codes = at::randint(0, 1 << bits, {3, 128}, at::kLong);
    at::Tensor wq = hearth::nn::pack_codes(codes, bits);
    ASSERT_EQ(wq.size(1), 128 * bits / 32) << bits;
    EXPECT_TRUE(at::equal(hearth::nn::unpack_codes(wq, bits, 128).to(at::kLong), codes)) << "bits " << bits;
    for (int64_t r = 0; r < 3; ++r) {
      std::vector<int> row(128);
      for (int j = 0; j < 128; ++j) row[j] = static_cast<int>(codes[r][j].item<int64_t>());
      std::vector<uint8_t> expect = mlx_pack_bytes(row, bits);
      ASSERT_EQ(expect.size(), static_cast<size_t>(wq.size(1) * 4));
      const uint8_t* got = reinterpret_cast<const uint8_t*>(wq[r].contiguous().data_ptr<int32_t>());
      EXPECT_EQ(0, std::memcmp(got, expect.data(), expect.size())) << "bits " << bits << " row " << r;
    }
  }
  EXPECT_THROW(hearth::nn::pack_codes(at::full({1, 32}, 16, at::kLong), 4), hearth::Error);
}

// 4-bit, group 32, by hand from mlx's formula:
// row 0: w_j = j - 16 ∈ [-16, 15]. |w_min| > |w_max| → scale0 = 31/15 (positive), edge = -16,
//   q0 = rint(-16 / 2.0667) = rint(-7.74) = -8 → scale = -16/-8 = 2, bias = -16.
//   q_j = clamp(rint(j/2), 0, 15): ties go to even (j=1 → 0, j=3 → 2, j=5 → 2), j=31 → 16 → 15.
// row 1: w_j = 16 - j ∈ [-15, 16]. |w_min| < |w_max| → scale0 = -31/15, edge = 16,
//   q0 = rint(16 / -2.0667) = -8 → scale = 16/-8 = -2, bias = 16; q_j = rint(j/2) as above.
TEST(Quant, DeviceUnpackMatchesWordDecoder) {
  // The tensor-op unpack (used on CUDA) against the CPU word decoder, for every code value in every
  // lane (the top lane of a word exercises int32 sign bits).
  for (int bits : {2, 4, 8}) {
    const int64_t out = 5, in = 256;
    at::Tensor codes = at::remainder(at::arange(out * in, at::kLong) * 7 + 3, 1 << bits).view({out, in});
    codes[0].fill_((1 << bits) - 1);  // all ones: every word negative as int32
    const at::Tensor wq = hearth::nn::pack_codes(codes, bits);
    const at::Tensor a = hearth::nn::unpack_codes(wq, bits, in);
    const at::Tensor b = hearth::nn::unpack_codes_on_device(wq, bits, in);
    EXPECT_EQ(b.scalar_type(), at::kByte);
    EXPECT_TRUE(at::equal(a, b)) << bits << " bits";
    EXPECT_TRUE(at::equal(b.to(at::kLong), codes)) << bits << " bits";
  }
  EXPECT_THROW(hearth::nn::unpack_codes_on_device(at::zeros({2, 6}, at::kInt), 3, 64), hearth::Error);
}

TEST(Quant, HandComputedFourBit) {
  at::Tensor w = at::empty({2, 32}, at::kFloat);
  for (int j = 0; j < 32; ++j) {
    w[0][j] = static_cast<float>(j - 16);
    w[1][j] = static_cast<float>(16 - j);
  }
  QuantizedWeight q = hearth::nn::quantize(w, QuantSpec{4, 32});
  EXPECT_FLOAT_EQ(q.scales[0][0].item<float>(), 2.0f);
  EXPECT_FLOAT_EQ(q.biases[0][0].item<float>(), -16.0f);
  EXPECT_FLOAT_EQ(q.scales[1][0].item<float>(), -2.0f);
  EXPECT_FLOAT_EQ(q.biases[1][0].item<float>(), 16.0f);
  at::Tensor codes = hearth::nn::unpack_codes(q.wq, 4, 32);
  for (int j = 0; j < 32; ++j) {
    int expect = (j % 2 == 0) ? j / 2 : ((j / 2) % 2 == 0 ? j / 2 : j / 2 + 1);  // round half to even
    expect = std::min(expect, 15);
    EXPECT_EQ(codes[0][j].item<int>(), expect) << j;
    EXPECT_EQ(codes[1][j].item<int>(), expect) << j;
  }
  // Word 0 holds codes 0,0,1,2,2,2,3,4 in nibbles from the low end.
  EXPECT_EQ(static_cast<uint32_t>(q.wq[0][0].item<int32_t>()), 0x43222100u);
  at::Tensor d = hearth::nn::dequantize(q);
  EXPECT_FLOAT_EQ(d[0][31].item<float>(), 14.0f);  // clamped: 2*15 - 16
  EXPECT_FLOAT_EQ(d[0][3].item<float>(), -12.0f);   // 2*2 - 16
  EXPECT_FLOAT_EQ(d[1][3].item<float>(), 12.0f);    // -2*2 + 16
}

// 8-bit, group 32: w_0 = -255, w_j = -255 + 8j (j = 1..30), w_5 = -214.5, w_31 = 0.
// |w_min| > |w_max| → scale0 = 255/255 = 1, edge = -255, q0 = -255 → scale = 1, bias = -255;
// q_j = rint(w_j + 255) = 8j, except q_5 = rint(40.5) = 40 (tie to even) and q_31 = 255.
TEST(Quant, HandComputedEightBit) {
  at::Tensor w = at::empty({1, 32}, at::kFloat);
  for (int j = 0; j < 32; ++j) w[0][j] = static_cast<float>(-255 + 8 * j);
  w[0][5] = -214.5f;
  w[0][31] = 0.0f;
  QuantizedWeight q = hearth::nn::quantize(w, QuantSpec{8, 32});
  EXPECT_FLOAT_EQ(q.scales[0][0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(q.biases[0][0].item<float>(), -255.0f);
  at::Tensor codes = hearth::nn::unpack_codes(q.wq, 8, 32);
  for (int j = 0; j < 31; ++j) EXPECT_EQ(codes[0][j].item<int>(), j == 5 ? 40 : 8 * j) << j;
  EXPECT_EQ(codes[0][31].item<int>(), 255);
  EXPECT_EQ(static_cast<uint32_t>(q.wq[0][0].item<int32_t>()), 0x18100800u);  // codes 0, 8, 16, 24
}

TEST(Quant, ConstantGroupsAreExact) {
  at::Tensor w = at::cat({at::zeros({1, 64}), at::full({1, 64}, 0.37f)}, 0);
  QuantizedWeight q = hearth::nn::quantize(w, QuantSpec{4, 64});
  EXPECT_TRUE(at::allclose(hearth::nn::dequantize(q), w, 0, 1e-6));
}

// Error bound: elements quantized without clamping are within |scale|/2 (rounding to nearest);
// the edge opposite the exact one may clamp, which mlx's refit of the scale bounds by |scale|.
TEST(Quant, DequantizeErrorBounded) {
  at::manual_seed(2);
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int gs : {32, 64, 128}) {
      at::Tensor w = at::randn({16, 256}) * 0.05 + at::randn({16, 1}) * 0.01;
      QuantizedWeight q = hearth::nn::quantize(w, QuantSpec{bits, gs});
      ASSERT_EQ(q.scales.sizes(), (std::vector<int64_t>{16, 256 / gs}));
      ASSERT_EQ(q.scales.scalar_type(), at::kFloat);
      at::Tensor err = (hearth::nn::dequantize(q) - w).abs().view({16, 256 / gs, gs});
      at::Tensor half = q.scales.abs().unsqueeze(-1) * 0.5 + 1e-6;
      at::Tensor codes = hearth::nn::unpack_codes(q.wq, bits, 256).view({16, 256 / gs, gs});
      at::Tensor interior = codes.gt(0).logical_and(codes.lt((1 << bits) - 1));
      EXPECT_TRUE(err.le(half).logical_or(interior.logical_not()).all().item<bool>()) << bits << "/" << gs;
      EXPECT_TRUE(err.le(half * 2).all().item<bool>()) << bits << "/" << gs;
      // The edge kept exact: the larger-magnitude extreme of every group decodes to itself.
      at::Tensor wg = w.view({16, 256 / gs, gs});
      at::Tensor mx = wg.amax(-1), mn = wg.amin(-1);
      at::Tensor edge = at::where(mn.abs().gt(mx.abs()), mn, mx);
      at::Tensor edge_idx = (wg - edge.unsqueeze(-1)).abs().argmin(-1, true);
      EXPECT_TRUE(err.gather(-1, edge_idx).le(1e-5).all().item<bool>()) << bits << "/" << gs;
    }
}

TEST(Quant, ScalesTakeHalfPrecisionDtype) {
  at::Tensor w = at::randn({4, 64}).to(at::kBFloat16);
  QuantizedWeight q = hearth::nn::quantize(w, QuantSpec{4, 32});
  EXPECT_EQ(q.scales.scalar_type(), at::kBFloat16);
  EXPECT_EQ(q.biases.scalar_type(), at::kBFloat16);
  EXPECT_EQ(q.in_features(), 64);
  EXPECT_EQ(q.out_features(), 4);
}

TEST(Quant, MatmulMatchesReference) {
  at::manual_seed(3);
  const int64_t in = 256, out = 40;
  for (auto sdt : {at::kFloat, at::kBFloat16})
    for (int bits : {2, 3, 4, 5, 6, 8})
      for (int gs : {32, 64, 128}) {
        QuantizedWeight q = hearth::nn::quantize(at::randn({out, in}).to(sdt), QuantSpec{bits, gs});
        // 70 rows: past the SIMD kernel's limit, the tiled dequantize + BLAS path.
        for (auto shape : std::vector<std::vector<int64_t>>{{1, in}, {7, in}, {2, 3, in}, {2, 9, in}, {in}, {70, in}}) {
          at::Tensor x = at::randn(shape);
          at::Tensor y = hearth::nn::quantized_matmul(x, q);
          at::Tensor yr = hearth::nn::quantized_matmul_ref(x, q);
          std::vector<int64_t> oshape = shape;
          oshape.back() = out;
          ASSERT_EQ(y.sizes().vec(), oshape);
          EXPECT_TRUE(at::allclose(y, yr, 1e-4, 1e-4))
              << "bits " << bits << " gs " << gs << " x " << x.sizes() << " max diff "
              << (y - yr).abs().max().item<float>();
        }
      }
}

// The CPU fast paths for 4 and 8 bits (decode fused with the dot, M <= 8) against the dequantize +
// matmul reference, for every group size, M = 1, 3, 8, scales in each float dtype, and an output
// count that does not split evenly over threads. Codes include the extremes (0 and 2^bits-1 in
// every lane: the high nibble of a 4-bit byte, the top byte of a word).
TEST(Quant, SmallMFastPathsMatchReference) {
  at::manual_seed(11);
  const int64_t in = 768, out = 37;
  for_each_isa([&](hearth::nn::simd::Isa) {
  for (int bits : {4, 8})
    for (int gs : {32, 64, 128})
      for (auto sdt : {at::kFloat, at::kBFloat16, at::kHalf}) {
        QuantizedWeight q = hearth::nn::quantize(at::randn({out, in}).to(sdt), QuantSpec{bits, gs});
        at::Tensor codes = at::randint(0, 1 << bits, {out, in}, at::kLong);
        codes[0].fill_((1 << bits) - 1);
        codes[1].fill_(0);
        q.wq = hearth::nn::pack_codes(codes, bits);
        for (int64_t M : {1, 3, 8}) {
          at::Tensor x = at::randn({M, in});
          at::Tensor y = hearth::nn::quantized_matmul(x, q);
          at::Tensor yr = hearth::nn::quantized_matmul_ref(x, q);
          ASSERT_EQ(y.sizes().vec(), (std::vector<int64_t>{M, out}));
          EXPECT_TRUE(at::allclose(y, yr, 1e-4, 1e-4))
              << "bits " << bits << " gs " << gs << " scales " << sdt << " M " << M << " max diff "
              << (y - yr).abs().max().item<float>();
        }
      }  });
}

// Every M path of the CPU kernel (SIMD blocks of 1..8 rows of x, several blocks, a partial last
// block, the tiled path past 64 rows; 4 and 2 weight rows per block plus single tail rows: out =
// 37) for each instruction set, bits 4 and 8, every group size, and in = 96 / 384 (3 groups of
// 32, 6 of 64 or 3 of 128), against dequantize + matmul.
TEST(Quant, SimdKernelMatchesReferenceEveryM) {
  at::manual_seed(21);
  for_each_isa([](hearth::nn::simd::Isa isa) {
    for (int bits : {4, 8})
      for (int gs : {32, 64, 128})
        for (int64_t in : {96, 384}) {
          if (in % gs) continue;
          for (auto sdt : {at::kFloat, at::kBFloat16}) {
            QuantizedWeight q = hearth::nn::quantize(at::randn({37, in}).to(sdt), QuantSpec{bits, gs});
            at::Tensor codes = at::randint(0, 1 << bits, {37, in}, at::kLong);
            codes[0].fill_((1 << bits) - 1);
            codes[36].fill_((1 << bits) - 1);
            q.wq = hearth::nn::pack_codes(codes, bits);
            for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 33, 64, 65}) {
              at::Tensor x = at::randn({M, in});
              at::Tensor y = hearth::nn::quantized_matmul(x, q);
              at::Tensor yr = hearth::nn::quantized_matmul_ref(x, q);
              ASSERT_EQ(y.sizes().vec(), (std::vector<int64_t>{M, 37}));
              EXPECT_TRUE(at::allclose(y, yr, 1e-4, 1e-4))
                  << "isa " << static_cast<int>(isa) << " bits " << bits << " gs " << gs << " in " << in << " scales "
                  << sdt << " M " << M << " max diff " << (y - yr).abs().max().item<float>();
            }
          }
        }
  });
}

// A batched decode step must give every row exactly what it gets alone (the server promises a
// request the same answer whether or not it shares a step): with the SIMD kernel each output is
// summed in the same order whatever the number of rows, so row m of a batch of M is bit-identical
// to the one-row product, for M up to the kernel's limit of 64.
TEST(Quant, SimdBatchedRowsEqualSingleRows) {
  using hearth::nn::simd::Isa;
  at::manual_seed(22);
  for_each_isa([](Isa isa) {
    if (isa == Isa::kNone) return;
    for (int bits : {4, 8}) {
      QuantizedWeight q = hearth::nn::quantize(at::randn({41, 256}).to(at::kBFloat16), QuantSpec{bits, 64});
      for (int64_t M : {2, 3, 8, 13, 32, 64}) {
        at::Tensor x = at::randn({M, 256});
        at::Tensor y = hearth::nn::quantized_matmul(x, q);
        for (int64_t m = 0; m < M; ++m)
          EXPECT_TRUE(at::equal(y[m], hearth::nn::quantized_matmul(x[m], q)))
              << "isa " << static_cast<int>(isa) << " bits " << bits << " M " << M << " row " << m;
      }
    }
  });
}

// The decode shape of a small model's tied lm_head: [1, 384] x [32000, 384]ᵀ, in bf16 as at run time.
TEST(Quant, SmallMFastPathLmHeadShape) {
  at::manual_seed(12);
  for (int bits : {4, 8}) {
    QuantizedWeight q = hearth::nn::quantize(at::randn({32000, 384}).to(at::kBFloat16), QuantSpec{bits, 64});
    at::Tensor x = at::randn({1, 1, 384});
    at::Tensor yr = hearth::nn::quantized_matmul_ref(x, q);
    for_each_isa([&](hearth::nn::simd::Isa isa) {
      at::Tensor y = hearth::nn::quantized_matmul(x, q);
      ASSERT_EQ(y.sizes().vec(), (std::vector<int64_t>{1, 1, 32000}));
      EXPECT_TRUE(at::allclose(y, yr, 1e-4, 1e-4))
          << bits << " bits, isa " << static_cast<int>(isa) << ", max diff " << (y - yr).abs().max().item<float>();
    });
  }
}

// The fused kernels record no autograd graph, so an x that requires grad must still get dL/dx = W
// (through the reference path): y.sum() → x.grad[m, k] = Σ_o W[o, k].
TEST(Quant, MatmulKeepsGradientToX) {
  at::manual_seed(13);
  QuantizedWeight q = hearth::nn::quantize(at::randn({24, 128}), QuantSpec{4, 64});
  at::Tensor x = at::randn({2, 128}).set_requires_grad(true);
  hearth::nn::quantized_matmul(x, q).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  const at::Tensor expect = hearth::nn::dequantize(q, at::kFloat).sum(0).expand({2, 128});
  EXPECT_TRUE(at::allclose(x.grad(), expect, 1e-5, 1e-5));
}

TEST(Quant, MatmulKeepsInputDtype) {
  QuantizedWeight q = hearth::nn::quantize(at::randn({8, 64}), QuantSpec{4, 64});
  at::Tensor x = at::randn({3, 64}).to(at::kBFloat16);
  at::Tensor y = hearth::nn::quantized_matmul(x, q);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::allclose(y.to(at::kFloat), hearth::nn::quantized_matmul_ref(x.to(at::kFloat), q), 2e-2, 5e-2));
}

TEST(Quant, BadSpecsAndShapesThrow) {
  try {
    hearth::nn::check_quant_spec(QuantSpec{7, 64}, "config.json: quantization");
    FAIL();
  } catch (const hearth::Error& e) {
    EXPECT_STREQ(e.what(), "config.json: quantization.bits: 7 unsupported (expected 2,3,4,5,6,8)");
  }
  EXPECT_THROW(hearth::nn::check_quant_spec(QuantSpec{4, 48}, "x"), hearth::Error);
  EXPECT_THROW(hearth::nn::quantize(at::randn({4, 48}), QuantSpec{4, 32}), hearth::Error);
  QuantizedWeight q = hearth::nn::quantize(at::randn({8, 64}), QuantSpec{4, 32});
  EXPECT_THROW(hearth::nn::quantized_matmul(at::randn({2, 32}), q), hearth::Error);
  q.scales = q.scales.narrow(1, 0, 1);
  EXPECT_THROW(hearth::nn::quantized_matmul(at::randn({2, 64}), q), hearth::Error);
}

// On CUDA, dequantize is one kernel (kernels::affine_dequantize); its bits are the tensor ops' (the
// same ops on the CPU, and on the GPU with the fused path off), for every width that divides a word,
// every group size, scale dtype and output dtype.
TEST(Quant, CudaDequantizeKernelIsTheTensorOpsBitForBit) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(41);
  for (int bits : {2, 4, 8})
    for (int gs : {32, 64, 128})
      for (at::ScalarType sdt : {at::kFloat, at::kBFloat16, at::kHalf})
        for (at::ScalarType out : {at::kFloat, at::kBFloat16}) {
          hearth::nn::QuantizedWeight q = hearth::nn::quantize(at::randn({48, 256}) * 0.1, hearth::nn::QuantSpec{bits, gs});
          q.scales = q.scales.to(sdt);
          q.biases = q.biases.to(sdt);
          const at::Tensor on_cpu = hearth::nn::dequantize(q, out);
          const hearth::nn::QuantizedWeight qc{q.wq.to(cuda), q.scales.to(cuda), q.biases.to(cuda), q.spec};
          const at::Tensor kernel = hearth::nn::dequantize(qc, out);
          const bool was = hearth::nn::set_fused_decode(false);
          const at::Tensor ops = hearth::nn::dequantize(qc, out);
          hearth::nn::set_fused_decode(was);
          ASSERT_EQ(kernel.scalar_type(), out);
          EXPECT_TRUE(at::equal(kernel.cpu(), on_cpu)) << bits << " bits, gs " << gs << ", " << sdt << " → " << out;
          EXPECT_TRUE(at::equal(kernel, ops)) << bits << " bits, gs " << gs << ", " << sdt << " → " << out;
        }
}
