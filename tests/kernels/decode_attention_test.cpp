// The split-K decode attention (kernels/decode_attention.cu through nn/decode_attention.h and
// nn::attention): on CUDA against a float64 reference of the same bf16/fp32 inputs over key counts
// 1..32768 (one split and many), GQA n_rep 1/4/8, head dims 64/128/256, three batch rows with
// different masks (all visible, a masked tail, a sliding-window band), k/v as strided windows of a
// larger static-cache buffer, q transposed from [B, T, H, D]; T = 2; a row with every key masked;
// nn::attention's dispatch (bit-equal to the kernel, close to the fused-off path); a CUDA graph
// capture replayed on new inputs; the register kernel (bf16/fp16, ≤ 8 rows) called directly in
// every instance (head dim, row bucket, own mask rows per token) over forced split counts, with
// finite, −inf, fully masked and batch-broadcast masks. On the CPU: the split plan, the tile size,
// the applicability check, and that nothing applies off CUDA. The CUDA tests skip without a GPU.
#include <gtest/gtest.h>

#include <ATen/Context.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "core/cuda_graph.h"
#include "core/torch_compat.h"
#include "kernels/decode_attention.h"
#include "nn/attention.h"
#include "nn/decode_attention.h"
#include "cuda_kernel_test_util.h"
#include "nn/fused_ops.h"

#ifdef HEARTH_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

namespace hk = hearth::kernels;

struct DatFused {
  bool was_fused, was_tf32;
  explicit DatFused(bool on)
      : was_fused(hearth::nn::set_fused_decode(on)), was_tf32(at::globalContext().allowTF32CuBLAS()) {
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  ~DatFused() {
    hearth::nn::set_fused_decode(was_fused);
    at::globalContext().setAllowTF32CuBLAS(was_tf32);
  }
};

// float64 softmax(q kᵀ·scale + mask) v of the given (already rounded) inputs, grouped as the
// kernel reads them: q [B, H, T, D] → [B, Hkv, n_rep·T, D] against k/v [B, Hkv, S, D].
at::Tensor dat_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                         double scale) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const int64_t n_rep = H / Hkv;
  at::Tensor qg = q.to(at::kDouble).reshape({B, Hkv, n_rep * T, D});
  at::Tensor s = at::matmul(qg, k.to(at::kDouble).transpose(2, 3)) * scale;  // [B, Hkv, n_rep·T, S]
  if (mask.defined()) {
    at::Tensor m = mask.to(at::kDouble);
    if (m.dim() == 2) m = m.unsqueeze(0).unsqueeze(0);
    m = m.expand({B, 1, T, S}).unsqueeze(2).expand({B, 1, n_rep, T, S}).reshape({B, 1, n_rep * T, S});
    s = s + m;
  }
  return at::matmul(at::softmax(s, -1), v.to(at::kDouble)).reshape({B, H, T, D});
}

// Additive mask [B, 1, T, S] in dt: row 0 sees keys ≤ its position (S-1: all), row 1 a masked
// tail (keys > S/2), row 2 a sliding-window band of max(1, S/8) keys ending at 3S/4; token t of
// a row sits t positions before the row's position (T > 1).
at::Tensor dat_mask(int64_t B, int64_t T, int64_t S, at::ScalarType dt, const at::Device& dev) {
  std::vector<uint8_t> ok(static_cast<size_t>(B * T * S), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t back = T - 1 - t;
      int64_t pos = S - 1, window = S + 1;
      if (b % 3 == 1) pos = S / 2;
      if (b % 3 == 2) pos = 3 * S / 4, window = std::max<int64_t>(1, S / 8);
      pos = std::max<int64_t>(0, pos - back);
      for (int64_t j = 0; j < S; ++j) ok[(b * T + t) * S + j] = j <= pos && j > pos - window;
    }
  at::Tensor allowed = at::from_blob(ok.data(), {B, 1, T, S}, at::kByte).to(dev, at::kBool);
  const auto o = at::TensorOptions().dtype(dt).device(dev);
  return at::where(allowed, at::zeros({}, o), at::full({}, hearth::nn::mask_min(dt), o));
}

// max |got − ref| over max |v|: the output is a convex combination of v's rows, so rounding of the
// weighted sum scales with |v|, not with the (often much smaller) output.
double dat_err(const at::Tensor& got, const at::Tensor& ref, const at::Tensor& v) {
  const double vmax = v.to(at::kDouble).abs().max().item<double>();
  return (got.to(at::kDouble) - ref).abs().max().item<double>() / std::max(vmax, 1e-30);
}

// Tolerances (relative to max |v|): float32 accumulates in float32 in another order than the
// float64 reference (a few hundred sequential FMAs per split, then the merge: ~1e-6 typical,
// 2e-5 leaves margin); bf16/fp16 add one rounding of the output (2^-8 / 2^-11 relative to the
// output, which is ≤ max |v|), no other rounding (q, k, v, the mask are exact in float32).
double dat_tol(at::ScalarType dt) { return dt == at::kFloat ? 2e-5 : dt == at::kHalf ? 1e-3 : 4.5e-3; }

struct DatCase {
  int64_t B, Hkv, n_rep, T, S, D;
  at::ScalarType dt;
};

// Runs one case: q from [B, T, H, D] transposed, k/v windows [B, Hkv, S, D] of [B+1, Hkv, S+13, D]
// buffers (the static cache's strides), the per-row mask; returns the error against float64.
double dat_run(const DatCase& c, uint64_t seed) {
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(seed);
  const int64_t H = c.Hkv * c.n_rep, C = c.S + 13;
  const auto o = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor q = at::randn({c.B, c.T, H, c.D}, o).to(cuda, c.dt).transpose(1, 2);
  const at::Tensor kbuf = at::randn({c.B + 1, c.Hkv, C, c.D}, o).to(cuda, c.dt);
  const at::Tensor vbuf = at::randn({c.B + 1, c.Hkv, C, c.D}, o).to(cuda, c.dt);
  const at::Tensor k = kbuf.narrow(0, 0, c.B).narrow(2, 0, c.S), v = vbuf.narrow(0, 0, c.B).narrow(2, 0, c.S);
  const at::Tensor mask = dat_mask(c.B, c.T, c.S, c.dt, cuda);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  at::Tensor got;
  {
    DatFused on(true);
    got = hearth::nn::decode_attention(q, k, v, mask, scale);
  }
  EXPECT_TRUE(got.defined()) << "kernel did not apply";
  if (!got.defined()) return 1e9;
  EXPECT_EQ(got.sizes(), q.sizes());
  EXPECT_FALSE(got.isnan().any().item<bool>());
  return dat_err(got, dat_reference(q, k, v, mask, scale), v);
}

#ifdef HEARTH_WITH_CUDA_KERNELS
// The kernel called directly, set up as nn::decode_attention does, with splits of `tiles` tiles
// each (0: decode_attention_plan's for 132 SMs; −1: one split; −2: 37 keys each, not a whole
// step), running `kernel`: q [B, H, T, D], k/v [B, Hkv, S, D]
// (head dim contiguous), mask [Bm, 1, T, S] in q's dtype with Bm ∈ {1, B} (undefined: none). The
// output [B, H, T, D] (a view of [B, T, H, D]) starts as NaN: an element never written shows.
at::Tensor dat_direct(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                      double scale, int64_t tiles, int* n_split,
                      hk::DecodeAttentionKernel kernel = hk::DecodeAttentionKernel::kCudaCores) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const int64_t R = H / Hkv * T;
  hk::DecodeAttentionArgs a;
  a.q = q.data_ptr(), a.q_sb = q.stride(0), a.q_sh = q.stride(1), a.q_st = q.stride(2);
  a.k = k.data_ptr(), a.k_sb = k.stride(0), a.k_sh = k.stride(1), a.k_ss = k.stride(2);
  a.v = v.data_ptr(), a.v_sb = v.stride(0), a.v_sh = v.stride(1), a.v_ss = v.stride(2);
  if (mask.defined()) {
    a.mask = mask.data_ptr();
    a.m_sb = mask.size(0) == 1 ? 0 : mask.stride(0);
    a.m_st = mask.size(2) == 1 ? 0 : mask.stride(2);
  }
  a.B = B, a.H = H, a.Hkv = Hkv, a.T = T, a.S = S, a.D = D;
  a.scale = static_cast<float>(scale);
  const at::ScalarType st = q.scalar_type();
  a.dtype = st == at::kHalf ? hk::QDtype::kFloat16 : st == at::kBFloat16 ? hk::QDtype::kBFloat16 : hk::QDtype::kFloat32;
  a.kernel = kernel;
  const int tile = hk::decode_attention_step_keys(a);
  if (tiles == 0) {
    a.plan = hk::decode_attention_plan(B * Hkv, S, tile, 132);
  } else if (tiles == -2) {  // ragged splits of 37 keys (the tensor-core kernel only)
    a.plan.keys_per_split = std::min<int64_t>(37, S);
    a.plan.n_split = static_cast<int>((S + a.plan.keys_per_split - 1) / a.plan.keys_per_split);
  } else {
    a.plan.keys_per_split = tiles > 0 ? tiles * tile : (S + tile - 1) / tile * tile;
    a.plan.n_split = static_cast<int>((S + a.plan.keys_per_split - 1) / a.plan.keys_per_split);
  }
  const int64_t ws_floats = hk::decode_attention_workspace_floats(B * Hkv, a.plan.n_split, R, D);
  const at::Tensor ws = at::empty({std::max<int64_t>(ws_floats, 4)}, q.options().dtype(at::kFloat));
  a.workspace = ws.data_ptr<float>();
  const at::Tensor out = at::full({B, T, H, D}, NAN, q.options());
  a.out = out.data_ptr();
  a.o_sb = T * H * D, a.o_sh = D, a.o_st = H * D;
  a.stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  EXPECT_TRUE(hk::decode_attention_supported(a));
  const char* err = hk::decode_attention(a);
  EXPECT_TRUE(err == nullptr) << (err ? err : "");
  if (n_split) *n_split = a.plan.n_split;
  return out.permute({0, 2, 1, 3});
}

// Masks of the register-kernel test, [4, 1, T, S] in dt. Batch row 0: token t sees keys
// ≤ S−1−2·(T−1−t) (at least key 0), finfo.min elsewhere; row 1: a band (pos − w, pos] with
// pos = max(0, S/2 − 3t), w = max(1, S/7), −inf elsewhere; row 2: every key finfo.min (fully
// masked: the softmax of the masked scores, the mean of v for bf16); row 3: the last token −inf
// everywhere (output 0), earlier tokens nothing masked.
at::Tensor dat_regs_mask(int64_t T, int64_t S, at::ScalarType dt, const at::Device& dev) {
  const float lo = static_cast<float>(hearth::nn::mask_min(dt)), ninf = -INFINITY;
  std::vector<float> m(static_cast<size_t>(4 * T * S), 0.f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < S; ++j) {
      const int64_t pos0 = std::max<int64_t>(0, S - 1 - 2 * (T - 1 - t));
      const int64_t pos1 = std::max<int64_t>(0, S / 2 - 3 * t), w1 = std::max<int64_t>(1, S / 7);
      m[(0 * T + t) * S + j] = j <= pos0 ? 0.f : lo;
      m[(1 * T + t) * S + j] = j <= pos1 && j > pos1 - w1 ? 0.f : ninf;
      m[(2 * T + t) * S + j] = lo;
      m[(3 * T + t) * S + j] = t == T - 1 ? ninf : 0.f;
    }
  return at::from_blob(m.data(), {4, 1, T, S}, at::kFloat).to(dev, dt);
}
#endif

}  // namespace

TEST(DecodeAttentionKernel, PlanSplitsLongContextsAndKeepsShortOnesWhole) {
  // H200 (132 SMs), Llama-3.2-1B at batch 1: 8 kv heads, bf16 D = 64, 4 rows → step of 64 keys.
  hk::DecodeAttentionPlan p = hk::decode_attention_plan(8, 32768, 64, 132);
  EXPECT_EQ(p.n_split, 64);  // 512 blocks ≥ 2 waves of 132 (splits of ≥ 2·√32768 = 363 keys: 91 allowed)
  EXPECT_EQ(p.keys_per_split, 512);
  // The measured optima of the register kernel: 704 keys → 11 splits of 64, 4,160 → 33 of 128
  // (not 65 of 64 nor 22 of 192); splits no shorter than ⌈2·√S⌉ keys (54, 129), at least one step.
  p = hk::decode_attention_plan(8, 704, 64, 132);
  EXPECT_EQ(p.n_split, 11);
  EXPECT_EQ(p.keys_per_split, 64);
  p = hk::decode_attention_plan(8, 4160, 64, 132);
  EXPECT_EQ(p.n_split, 33);
  EXPECT_EQ(p.keys_per_split, 128);
  p = hk::decode_attention_plan(8, 4160, 32, 132);  // 5..8 rows: steps of 32 keys, same splits
  EXPECT_EQ(p.n_split, 33);
  EXPECT_EQ(p.keys_per_split, 128);
  p = hk::decode_attention_plan(8, 512, 64, 132);
  EXPECT_EQ(p.n_split, 8);
  EXPECT_EQ(p.keys_per_split, 64);
  p = hk::decode_attention_plan(8, 2048, 64, 132);  // ⌈2·√2048⌉ = 91 → 16 splits of 128
  EXPECT_EQ(p.n_split, 16);
  EXPECT_EQ(p.keys_per_split, 128);
  p = hk::decode_attention_plan(8, 8192, 64, 132);  // 182 → 43 splits of 192 (fewer than the 66 wanted)
  EXPECT_EQ(p.n_split, 43);
  EXPECT_EQ(p.keys_per_split, 192);
  p = hk::decode_attention_plan(8, 64, 64, 132);
  EXPECT_EQ(p.n_split, 1);
  EXPECT_EQ(p.keys_per_split, 64);
  p = hk::decode_attention_plan(8, 1, 64, 132);
  EXPECT_EQ(p.n_split, 1);
  EXPECT_EQ(p.keys_per_split, 64);
  // B·Hkv = 6, S = 4097, steps of 32: splits of ≥ 129 keys → 32 splits wanted, 129 → 160 keys
  // (whole steps): 26 splits, the last with 97 keys.
  p = hk::decode_attention_plan(6, 4097, 32, 132);
  EXPECT_EQ(p.n_split, 26);
  EXPECT_EQ(p.keys_per_split, 160);
  // Head dim 256 (step of 16 keys), 704 keys: ≥ 54 keys → 14 splits wanted, 51 → 64 keys: 11 of 64.
  p = hk::decode_attention_plan(8, 704, 16, 132);
  EXPECT_EQ(p.n_split, 11);
  EXPECT_EQ(p.keys_per_split, 64);
  // 32 rows of the 1B (B·Hkv = 256): 3 splits of 256 over 704 keys (3 blocks per pair fill the GPU).
  p = hk::decode_attention_plan(256, 704, 64, 132);
  EXPECT_EQ(p.n_split, 3);
  EXPECT_EQ(p.keys_per_split, 256);
  // Enough (row, head) pairs to fill the GPU alone: one split.
  p = hk::decode_attention_plan(600, 32768, 64, 132);
  EXPECT_EQ(p.n_split, 1);
  EXPECT_EQ(p.keys_per_split, 32768);
  // One long head: the √S floor keeps the merge's serial walk short (171 splits of 768, not 512 of 256).
  p = hk::decode_attention_plan(1, 131072, 64, 132);
  EXPECT_EQ(p.n_split, 171);
  EXPECT_EQ(p.keys_per_split, 768);
  // Three blocks per SM (what the register and tensor-core kernels fit for 4 rows of 64): one
  // wave of 376 ≤ 396 blocks, 47 splits of 704, not 64 × 8 = 512 blocks in two waves.
  p = hk::decode_attention_plan(8, 32768, 64, 132, 3);
  EXPECT_EQ(p.n_split, 47);
  EXPECT_EQ(p.keys_per_split, 704);
  EXPECT_EQ(hk::decode_attention_plan(8, 32768, 64, 132, 0).n_split, 64);  // unknown occupancy: 4
  // An unknown SM count plans as for one SM (4 blocks): still splits a long single head.
  p = hk::decode_attention_plan(1, 32768, 64, 0);
  EXPECT_EQ(p.n_split, 4);
  EXPECT_EQ(p.keys_per_split, 8192);
  // Invariants over many shapes: every split non-empty, whole tiles, all keys covered, ≤ 1024, and
  // no more splits than S keys in splits of ⌈2·√S⌉ need (n_split ≤ ⌈S/⌈2√S⌉⌉, so (n_split−1)² < S/4).
  for (int64_t bh : {1, 3, 8, 24, 64, 200})
    for (int64_t S : {1, 2, 7, 63, 64, 65, 255, 257, 1000, 4097, 4160, 32768, 131072, 1 << 20, 1 << 30})
      for (int tk : {4, 8, 16, 32, 64}) {
        const hk::DecodeAttentionPlan q = hk::decode_attention_plan(bh, S, tk, 132);
        EXPECT_LT(4 * static_cast<int64_t>(q.n_split - 1) * (q.n_split - 1), S) << bh << " " << S << " " << tk;
        ASSERT_GE(q.n_split, 1);
        ASSERT_LE(q.n_split, 1024);
        EXPECT_EQ(q.keys_per_split % tk, 0) << bh << " " << S << " " << tk;
        EXPECT_LT(static_cast<int64_t>(q.n_split - 1) * q.keys_per_split, S) << bh << " " << S << " " << tk;
        EXPECT_GE(static_cast<int64_t>(q.n_split) * q.keys_per_split, S) << bh << " " << S << " " << tk;
      }
}

TEST(DecodeAttentionKernel, TileKeysAndSupportedShapes) {
  // Register kernel (bf16/fp16, ≤ 8 rows): 4 warps × loads per lane (4; 2 for 5..8 rows) × 256/D
  // keys per warp load.
  EXPECT_EQ(hk::decode_attention_tile_keys(2, 64, 4), 64);
  EXPECT_EQ(hk::decode_attention_tile_keys(2, 64, 1), 64);
  EXPECT_EQ(hk::decode_attention_tile_keys(2, 128, 2), 32);
  EXPECT_EQ(hk::decode_attention_tile_keys(2, 256, 3), 16);
  EXPECT_EQ(hk::decode_attention_tile_keys(2, 64, 5), 32);
  EXPECT_EQ(hk::decode_attention_tile_keys(2, 128, 8), 16);
  EXPECT_EQ(hk::decode_attention_tile_keys(2, 256, 8), 8);
  EXPECT_EQ(hk::decode_attention_regs_rows(3), 4);
  EXPECT_EQ(hk::decode_attention_regs_rows(7), 8);
  EXPECT_TRUE(hk::decode_attention_uses_regs(2, 8));
  EXPECT_FALSE(hk::decode_attention_uses_regs(2, 9));
  EXPECT_FALSE(hk::decode_attention_uses_regs(4, 4));
  // Tensor-core kernel: bf16/fp16, head dim 64 or 128, ≤ 16 rows; planned in steps of 64 keys.
  EXPECT_TRUE(hk::decode_attention_uses_mma(2, 64, 4));
  EXPECT_TRUE(hk::decode_attention_uses_mma(2, 128, 16));
  EXPECT_FALSE(hk::decode_attention_uses_mma(2, 128, 17));
  EXPECT_FALSE(hk::decode_attention_uses_mma(2, 256, 4));
  EXPECT_FALSE(hk::decode_attention_uses_mma(4, 64, 4));
  // Shared-memory tile kernel (fp32, or > 8 rows).
  EXPECT_EQ(hk::decode_attention_tile_keys(2, 64, 16), 32);
  EXPECT_EQ(hk::decode_attention_tile_keys(4, 64, 4), 32);
  EXPECT_EQ(hk::decode_attention_tile_keys(4, 256, 8), 8);
  EXPECT_EQ(hk::decode_attention_tile_keys(4, 256, 16), 4);
  EXPECT_EQ(hk::decode_attention_workspace_floats(8, 64, 4, 64), 8 * 64 * 4 * 66);
  EXPECT_EQ(hk::decode_attention_workspace_floats(8, 1, 4, 64), 0);

  // Llama-3.2-1B decode over a [1, 8, 32768, 64] window of a 40000-token static cache, bf16.
  float ws[4];
  hk::DecodeAttentionArgs a;
  a.B = 1, a.H = 32, a.Hkv = 8, a.T = 1, a.S = 32768, a.D = 64;
  a.k_ss = a.v_ss = 64, a.k_sh = a.v_sh = 40000 * 64, a.k_sb = a.v_sb = 8 * 40000 * 64;
  a.o_sb = 32 * 64, a.o_sh = 64, a.o_st = 32 * 64;
  a.dtype = hk::QDtype::kBFloat16;
  a.plan = hk::decode_attention_plan(8, a.S, 64, 132);
  a.workspace = ws;
  EXPECT_TRUE(hk::decode_attention_supported(a));
  EXPECT_TRUE(hk::decode_attention_runs_mma(a));
  EXPECT_EQ(hk::decode_attention_step_keys(a), 64);
  auto with = [&](auto change) {
    hk::DecodeAttentionArgs b = a;
    change(b);
    return hk::decode_attention_supported(b);
  };
  EXPECT_FALSE(with([](hk::DecodeAttentionArgs& b) { b.D = 96; }));                   // head dim
  EXPECT_FALSE(with([](hk::DecodeAttentionArgs& b) { b.D = 512; }));                  // Gemma 4 full layers
  EXPECT_FALSE(with([](hk::DecodeAttentionArgs& b) { b.H = 30; }));                   // H % Hkv
  EXPECT_FALSE(with([](hk::DecodeAttentionArgs& b) { b.T = 17; }));                   // 4·17 rows > 64
  EXPECT_TRUE(with([](hk::DecodeAttentionArgs& b) { b.T = 16; }));                    // 64 rows of 64
  EXPECT_FALSE(with([](hk::DecodeAttentionArgs& b) { b.T = 5, b.D = 256; }));          // 20 rows · 256 > 4096
  EXPECT_TRUE(with([](hk::DecodeAttentionArgs& b) { b.T = 4, b.D = 256; }));           // 16 rows · 256
  EXPECT_FALSE(with([](hk::DecodeAttentionArgs& b) { b.k_ss = 68; }));                // not 16-byte rows
  EXPECT_FALSE(with([](hk::DecodeAttentionArgs& b) { b.S = (int64_t{1} << 30) + 1; }));  // > 2^30 keys
  EXPECT_FALSE(with([](hk::DecodeAttentionArgs& b) { b.workspace = nullptr; }));      // several splits need it
  EXPECT_TRUE(with([](hk::DecodeAttentionArgs& b) { b.plan.keys_per_split = 520; }));  // tensor cores: ragged is fine
  EXPECT_FALSE(with([](hk::DecodeAttentionArgs& b) {  // the CUDA-core kernels: whole tiles only
    b.kernel = hk::DecodeAttentionKernel::kCudaCores;
    b.plan.keys_per_split = 520;
  }));
  EXPECT_FALSE(with([](hk::DecodeAttentionArgs& b) {  // tensor cores cannot run head dim 256
    b.kernel = hk::DecodeAttentionKernel::kTensorCores;
    b.D = 256;
  }));
  EXPECT_TRUE(with([](hk::DecodeAttentionArgs& b) {  // ... the CUDA-core kernels can
    b.kernel = hk::DecodeAttentionKernel::kCudaCores;
    b.D = 256;
  }));
  EXPECT_FALSE(with([](hk::DecodeAttentionArgs& b) { b.plan.n_split = 65; }));        // an empty split
  EXPECT_FALSE(with([](hk::DecodeAttentionArgs& b) { b.plan.n_split = 63; }));        // keys left over
  EXPECT_TRUE(with([](hk::DecodeAttentionArgs& b) {
    b.dtype = hk::QDtype::kFloat32;  // float32: 4-value chunks, tile of 32 keys
    b.k_ss = 68;
    b.plan = hk::decode_attention_plan(8, b.S, 32, 132);
  }));
  EXPECT_TRUE(with([](hk::DecodeAttentionArgs& b) {
    b.S = 60;
    b.plan = hk::decode_attention_plan(8, 60, 64, 132);  // one tile, one split: no workspace needed
    b.workspace = nullptr;
  }));
}

TEST(DecodeAttentionKernel, NotAppliedOnCpuOrWhenSwitchedOff) {
  const at::Tensor q = at::randn({1, 4, 1, 64}), k = at::randn({1, 1, 9, 64}), v = at::randn({1, 1, 9, 64});
  DatFused on(true);
  EXPECT_FALSE(hearth::nn::decode_attention(q, k, v, {}, 0.125).defined());
  // nn::attention on the CPU is unchanged: still softmax(q kᵀ·scale) v.
  hearth::nn::AttentionParams p;
  p.scale = 0.125;
  p.q_pos0 = 8;
  const at::Tensor got = hearth::nn::attention(q, k, v, p);
  const at::Tensor want = at::matmul(at::softmax(at::matmul(q, k.transpose(2, 3)) * 0.125, -1), v);
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6));
  if (!hearth::compat::cuda_available()) return;
  const at::Device cuda(at::kCUDA, 0);
  const at::Tensor qc = q.to(cuda), kc = k.to(cuda), vc = v.to(cuda);
  EXPECT_TRUE(hearth::nn::decode_attention(qc, kc, vc, {}, 0.125).defined() == hearth::testing::have_cuda_kernels());
  EXPECT_FALSE(hearth::nn::decode_attention(qc.narrow(3, 0, 48), kc.narrow(3, 0, 48), vc.narrow(3, 0, 48), {}, 0.125)
                   .defined());  // D = 48
  EXPECT_FALSE(hearth::nn::decode_attention(qc.clone().requires_grad_(true), kc, vc, {}, 0.125).defined());
  hearth::nn::set_fused_decode(false);
  EXPECT_FALSE(hearth::nn::decode_attention(qc, kc, vc, {}, 0.125).defined());
}

TEST(DecodeAttentionKernel, CudaMatchesFloat64AcrossShapes) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's CUDA kernels (GPU machine)";
  uint64_t seed = 100;
  for (at::ScalarType dt : {at::kBFloat16, at::kFloat})
    for (int64_t D : {64, 128, 256})
      for (int64_t n_rep : {1, 4, 8})
        for (int64_t S : {1, 7, 512, 4097, 32768}) {
          const int64_t B = 3;
          const DatCase c{B, 2, n_rep, 1, S, D, dt};
          const double err = dat_run(c, ++seed);
          EXPECT_LE(err, dat_tol(dt)) << "dtype " << dt << " D " << D << " n_rep " << n_rep << " S " << S << " B " << B;
          if (S == 32768) std::cout << "[decode-attn] " << dt << " D " << D << " n_rep " << n_rep << " S 32768: err/max|v| " << err << "\n";
        }
}

TEST(DecodeAttentionKernel, CudaManyRowsHalfAndTwoTokens) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's CUDA kernels (GPU machine)";
  // T = 2 (mask rows per token), the > 8-row instances (16, 32 and 64 rows), fp16, one kv head.
  const std::vector<DatCase> cases = {
      {3, 2, 4, 2, 4097, 64, at::kBFloat16}, {2, 2, 8, 2, 700, 128, at::kBFloat16}, {3, 1, 16, 1, 4097, 256, at::kFloat},
      {1, 2, 16, 4, 2000, 64, at::kBFloat16}, {3, 2, 32, 1, 1500, 128, at::kHalf},    {3, 8, 4, 1, 32768, 128, at::kHalf},
      {1, 1, 8, 1, 100000, 64, at::kBFloat16}};
  uint64_t seed = 500;
  for (const DatCase& c : cases) {
    const double err = dat_run(c, ++seed);
    EXPECT_LE(err, dat_tol(c.dt)) << "dtype " << c.dt << " B " << c.B << " Hkv " << c.Hkv << " n_rep " << c.n_rep
                                  << " T " << c.T << " S " << c.S << " D " << c.D;
  }
}

TEST(DecodeAttentionKernel, CudaFullyMaskedRowGivesSdpasMeanNotNan) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's CUDA kernels (GPU machine)";
  // Row 1 has every key masked with finfo.min: the scores are all exactly finfo.min in float32,
  // so SDPA (and the float64 reference) weigh every key equally: the mean of v. Row 0 sees all.
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(7);
  for (at::ScalarType dt : {at::kBFloat16, at::kFloat})
    for (int64_t S : {50, 3000}) {
      const at::Tensor q = at::randn({2, 8, 1, 64}).to(cuda, dt), k = at::randn({2, 2, S, 64}).to(cuda, dt);
      const at::Tensor v = at::randn({2, 2, S, 64}).to(cuda, dt);
      at::Tensor mask = at::zeros({2, 1, 1, S}, q.options());
      mask[1].fill_(hearth::nn::mask_min(dt));
      DatFused on(true);
      const at::Tensor got = hearth::nn::decode_attention(q, k, v, mask, 0.125);
      ASSERT_TRUE(got.defined());
      const at::Tensor mean = v[1].to(at::kDouble).mean(1).repeat_interleave(4, 0);  // [8, 64]
      EXPECT_LE(dat_err(got[1].squeeze(1), mean, v), dat_tol(dt)) << dt << " S " << S;
      EXPECT_LE(dat_err(got, dat_reference(q, k, v, mask, 0.125), v), dat_tol(dt)) << dt << " S " << S;
    }
}

TEST(DecodeAttentionKernel, CudaAttentionDispatchesToTheKernel) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's CUDA kernels (GPU machine)";
  // A static step's call: q [B, H, 1, D] (transposed), the whole capacity as k/v, mask [B,1,1,C].
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(11);
  for (at::ScalarType dt : {at::kBFloat16, at::kFloat}) {
    const int64_t B = 3, Hkv = 8, H = 32, D = 64, C = 5000;
    const at::Tensor q = at::randn({B, 1, H, D}).to(cuda, dt).transpose(1, 2);
    const at::Tensor k = at::randn({B, Hkv, C, D}).to(cuda, dt), v = at::randn({B, Hkv, C, D}).to(cuda, dt);
    hearth::nn::AttentionParams p;
    p.scale = 0.125;
    p.mask = dat_mask(B, 1, C, dt, cuda);
    at::Tensor on_out, off_out, kernel_out;
    {
      DatFused on(true);
      on_out = hearth::nn::attention(q, k, v, p);
      kernel_out = hearth::nn::decode_attention(q, k, v, p.mask, p.scale);
    }
    {
      DatFused off(false);
      off_out = hearth::nn::attention(q, k, v, p);
    }
    ASSERT_TRUE(kernel_out.defined());
    EXPECT_TRUE(at::equal(on_out, kernel_out));  // the dispatch took the kernel (deterministic)
    // The fused-off path (SDPA) rounds the probabilities to bf16 before p·v: one more rounding.
    EXPECT_LE(dat_err(on_out, off_out.to(at::kDouble), v), dt == at::kFloat ? 2e-5 : 8e-3) << dt;
    // The eager decode's own mask (positions, no explicit mask): T = 1 at the last position.
    hearth::nn::AttentionParams e;
    e.scale = 0.125;
    e.q_pos0 = C - 1;
    e.sliding_window = 100;  // needs a mask: built from the positions
    at::Tensor a1, a0;
    {
      DatFused on(true);
      a1 = hearth::nn::attention(q, k, v, e);
    }
    {
      DatFused off(false);
      a0 = hearth::nn::attention(q, k, v, e);
    }
    EXPECT_LE(dat_err(a1, a0.to(at::kDouble), v), dt == at::kFloat ? 2e-5 : 8e-3) << dt << " window";
  }
}

TEST(DecodeAttentionKernel, CudaGraphReplaysOnNewInputs) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's CUDA kernels (GPU machine)";
  // Captured once (with the workspace and output allocated inside the capture), replayed after the
  // inputs change in place: each replay equals an eager call on the same inputs, bit for bit.
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(21);
  const int64_t B = 2, Hkv = 8, H = 32, D = 64, C = 9000;
  const at::Tensor q = at::randn({B, H, 1, D}).to(cuda, at::kBFloat16);
  const at::Tensor k = at::randn({B, Hkv, C, D}).to(cuda, at::kBFloat16);
  const at::Tensor v = at::randn({B, Hkv, C, D}).to(cuda, at::kBFloat16);
  const at::Tensor mask = dat_mask(B, 1, C, at::kBFloat16, cuda);
  at::Tensor out = at::empty({B, H, 1, D}, q.options());
  DatFused on(true);
  hearth::compat::RecordedStep step([&] { out.copy_(hearth::nn::decode_attention(q, k, v, mask, 0.125)); }, cuda);
  for (int round = 0; round < 3; ++round) {
    q.normal_();
    k.narrow(2, round * 100, 50).normal_();
    v.mul_(0.5);
    mask.copy_(dat_mask(B, 1, C, at::kBFloat16, cuda).roll(round * 37, 3));
    step.replay();
    const at::Tensor eager = hearth::nn::decode_attention(q, k, v, mask, 0.125);
    EXPECT_TRUE(at::equal(out, eager)) << "round " << round;
    EXPECT_LE(dat_err(out, dat_reference(q, k, v, mask, 0.125), v), dat_tol(at::kBFloat16)) << "round " << round;
  }
  EXPECT_EQ(step.captured(), true);
}

TEST(DecodeAttentionKernel, CudaRegisterKernelEveryInstanceAndSplit) {
  if (!hearth::testing::have_cuda_kernels()) GTEST_SKIP() << "needs CUDA and Hearth's CUDA kernels (GPU machine)";
#ifdef HEARTH_WITH_CUDA_KERNELS
  // The CUDA-core kernels (bf16/fp16: the register kernel for R = n_rep·T ≤ 8, the tile kernel
  // above) and the tensor-core kernel (D 64/128, R ≤ 16; also in ragged splits of 37 keys) called
  // directly: every head dim and row bucket (R = 1, 2, 3→4, 4, 7→8, 8, 16; T = 1, 2, 4, 8 with a
  // mask row per token), 4 batch rows with
  // the masks of dat_regs_mask (finite and −inf, a fully masked row, an all −inf token), a
  // batch-broadcast mask (D = 64), S = 1, 45 and 1001 (no multiple of any step), splits of one
  // step, three steps, the plan's and one split; q transposed from [B, T, H, D], k/v windows of a
  // larger cache. Against float64 with the all −inf rows set to 0.
  const at::Device cuda(at::kCUDA, 0);
  const std::vector<std::pair<int64_t, int64_t>> reps_tokens = {{1, 1}, {2, 1}, {1, 2}, {3, 1}, {4, 1}, {2, 2},
                                                               {7, 1}, {4, 2}, {8, 1}, {1, 8}, {16, 1}, {4, 4}};
  uint64_t seed = 900;
  for (hk::DecodeAttentionKernel kernel : {hk::DecodeAttentionKernel::kCudaCores, hk::DecodeAttentionKernel::kTensorCores})
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf})
    for (int64_t D : {64, 128, 256})
      for (auto [n_rep, T] : reps_tokens)
        for (int64_t S : {1, 45, 1001}) {
          const bool mma = kernel == hk::DecodeAttentionKernel::kTensorCores;
          if (mma && !hk::decode_attention_uses_mma(2, D, n_rep * T)) continue;
          at::manual_seed(++seed);
          const int64_t B = 4, Hkv = 2, H = Hkv * n_rep, C = S + 13;
          const auto f = at::TensorOptions().dtype(at::kFloat);
          const at::Tensor q = at::randn({B, T, H, D}, f).to(cuda, dt).transpose(1, 2);
          const at::Tensor k = at::randn({B + 1, Hkv, C, D}, f).to(cuda, dt).narrow(0, 1, B).narrow(2, 3, S);
          const at::Tensor v = at::randn({B + 1, Hkv, C, D}, f).to(cuda, dt).narrow(0, 1, B).narrow(2, 3, S);
          const double scale = 1.0 / std::sqrt(static_cast<double>(D));
          const at::Tensor full_mask = dat_regs_mask(T, S, dt, cuda);
          for (bool bcast : {false, true}) {
            if (bcast && D != 64) continue;
            const at::Tensor mask = bcast ? full_mask.narrow(0, 1, 1) : full_mask;  // row 1's −inf band for all
            at::Tensor ref = dat_reference(q, k, v, mask, scale);
            ref = at::where(ref.isnan(), at::zeros_like(ref), ref);  // all −inf rows: 0, not NaN
            for (int64_t tiles : {1, 3, 0, -1, -2}) {
              if (tiles == -2 && !mma) continue;
              int n_split = 0;
              const at::Tensor got = dat_direct(q, k, v, mask, scale, tiles, &n_split, kernel);
              const std::string what = std::string(mma ? "tensor cores " : "cuda cores ") +
                                       std::string(dt == at::kHalf ? "fp16" : "bf16") + " D " + std::to_string(D) +
                                       " n_rep " + std::to_string(n_rep) + " T " + std::to_string(T) + " S " +
                                       std::to_string(S) + " splits " + std::to_string(n_split) +
                                       (bcast ? " broadcast mask" : "");
              for (int64_t b = 0; b < B; ++b) {
                // Row 2 (all finfo.min) in fp16: scores near −65504 are rounded to float32's 2^-8
                // there before the softmax, so up to ~2^-9 relative in each weight.
                const double tol = !bcast && b == 2 && dt == at::kHalf ? 4e-3 : dat_tol(dt);
                EXPECT_LE(dat_err(got[b], ref[b], v), tol) << what << " batch row " << b;
              }
              if (!bcast) {  // the last token of row 3 is −inf everywhere: exactly 0
                EXPECT_EQ(got[3].narrow(1, T - 1, 1).abs().max().item<double>(), 0.0) << what;
              }
            }
          }
        }
#endif
}
