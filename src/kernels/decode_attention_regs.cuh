// The register split kernel of Hearth's decode attention (kernels/decode_attention.h) for bf16/fp16
// and R = n_rep·T ≤ 8 query rows per kv head, and the merge kernel of both split kernels. Device
// code only, included by kernels/decode_attention.cu alone; not the launcher or the tile kernel.
//
// Shape of the work (block = split s of (batch row b, kv head g), 4 warps): the block walks its
// split in steps of kBK = decode_attention_tile_keys(2, D, R) keys; warp w takes keys
// [w·kWK, (w+1)·kWK) of a step, kIt loads of kKpl = 256/D keys each. In a load, lane = kLpk·key + c
// (kLpk = D/8 lanes per key): lane c holds 16 bytes (8 head-dim values) of the key's k row and of
// its v row, so a warp load reads kKpl whole key rows. All of a step's k, v and mask values are
// loaded before any arithmetic (one memory round trip per step) and the next step's are issued
// before this step's arithmetic (register double buffering). Scores: each lane dots its 8 values
// with the RB query rows (q in registers as float32, loaded once), xor-shuffles over the kLpk lanes
// of a key sum them (every lane of the key then holds the key's scores). Online softmax in
// registers: the step's max per row over the warp (xor-shuffles across its keys), running sum and
// accumulator per lane (the lane's keys, its 8 columns), summed over the warp's keys at the end.
// One __syncthreads: the 4 warps' (max, sum, accumulator) merged through shared memory in fixed
// warp order. One split writes out = o / l; several write (o, m, l) to the workspace.
//
// Masks: with a mask row per token (T > 1, m_st ≠ 0: the kRowMask instances) lane c < R of a key
// loads the mask value of row c's token (c % T) and row r's value comes from lane r of the key by
// shuffle; else every lane loads the one mask row's value and no shuffle is needed. −inf handling as the tile kernel's:
// keys past the split score −inf (their k/v registers are zeros: finite), a warp that has seen only
// −inf keeps max −inf with weight 0 in every merge (never exp(−inf − (−inf))), and a row with no
// weight at all writes 0. A masked key (finite lowest value) scores finite and gets weight exactly
// 0 beside any unmasked key (its exp underflows), and a fully masked row weighs its keys as the
// softmax of the masked scores (SDPA's result).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "decode_attention.h"
#include "decode_attention_warps.cuh"
#include "dtype.cuh"
#include "pdl.cuh"

namespace hearth::kernels::da_regs {

constexpr int kThreads = kDecodeAttentionThreads;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

// The 8 values of a 16-byte chunk (element 0 in the low half of .x) as float32, exactly.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& w, float* f);
template <>
__device__ __forceinline__ void unpack8<__nv_bfloat16>(const uint4& w, float* f) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}
template <>
__device__ __forceinline__ void unpack8<__half>(const uint4& w, float* f) {
  const __half2* h = reinterpret_cast<const __half2*>(&w);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// N consecutive values of T, aligned to their size: one store.
template <typename T, int N>
struct alignas(N * sizeof(T)) Vec {
  T v[N];
};

// Compile-time layout of one (head dim, row bucket) instance (host-evaluated constants: the tile
// comes from the header's decode_attention_tile_keys, as the host plan's does).
template <int D, int RB>
struct Cfg {
  static constexpr int kLpk = D / 8;                                // lanes per key: 8, 16, 32
  static constexpr int kKpl = 32 / kLpk;                            // keys per warp load: 4, 2, 1
  static constexpr int kBK = decode_attention_tile_keys(2, D, RB);  // keys per step of the block
  static constexpr int kWK = kBK / kWarps;                          // keys per warp per step
  static constexpr int kIt = kWK / kKpl;                            // k (and v) loads per lane per step
  static_assert(decode_attention_uses_regs(2, RB) && decode_attention_regs_rows(RB) == RB, "row bucket");
  static_assert(kIt * kKpl * kWarps == kBK && kIt == decode_attention_regs_loads(RB), "step keys");
  static_assert(RB <= kLpk, "row r's mask value comes from lane r of its key");
};

// kRowMask: the rows have mask rows of their own (T > 1 and m_st ≠ 0); else every row reads the
// same mask row (or none). A template argument: as a runtime flag it costs RB = 4 ~26 registers.
template <typename T, int D, int RB, bool kRowMask>
__global__ void __launch_bounds__(kThreads) split_kernel(const DecodeAttentionArgs a) {
  using C = Cfg<D, RB>;
  constexpr int kLpk = C::kLpk, kKpl = C::kKpl, kBK = C::kBK, kWK = C::kWK, kIt = C::kIt;
  static_assert(sizeof(T) == 2, "bf16 or fp16");
  static_assert(!kRowMask || RB >= 2, "own mask rows need T ≥ 2");
  __shared__ __align__(16) float o_s[kWarps][RB][D];
  __shared__ float m_s[kWarps][RB], l_s[kWarps][RB];

  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int grp = lane / kLpk, dc = lane % kLpk;  // key of the warp load, 16-byte column chunk
  const int split = static_cast<int>(blockIdx.x);
  const int64_t bh = blockIdx.y;
  const int64_t b = bh / a.Hkv, g = bh % a.Hkv;
  const int64_t n_rep = a.H / a.Hkv;
  const int nT = static_cast<int>(a.T);
  const int R = static_cast<int>(n_rep) * nT;  // ≤ RB
  const int k_begin = split * static_cast<int>(a.plan.keys_per_split);
  const int k_end = k_begin + static_cast<int>(a.plan.keys_per_split) < a.S
                        ? k_begin + static_cast<int>(a.plan.keys_per_split)
                        : static_cast<int>(a.S);
  const int n_steps = (k_end - k_begin + kBK - 1) / kBK;
  const T* __restrict__ kb = static_cast<const T*>(a.k) + b * a.k_sb + g * a.k_sh + dc * 8;
  const T* __restrict__ vb = static_cast<const T*>(a.v) + b * a.v_sb + g * a.v_sh + dc * 8;
  // This lane's mask row: with kRowMask that of row dc's token (row 0's past R), else the one row.
  const int tok = kRowMask ? (dc < R ? dc : 0) % nT : 0;
  const T* __restrict__ mrow = a.mask ? static_cast<const T*>(a.mask) + b * a.m_sb + tok * a.m_st : nullptr;

  pdl_launch_dependents();
  pdl_wait();  // q, the cache's newest key and value, the mask come from earlier kernels

  // Keys first + kKpl·i (i < kIt) of step c for this lane: k and v chunks and the additive bias
  // (the mask, 0 without one, −inf past the split).
  auto load = [&](int c, uint4* kx, uint4* vx, float* bx) {
    const int first = k_begin + c * kBK + warp * kWK + grp;
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int key = first + i * kKpl;
      if (key < k_end) {
        kx[i] = __ldg(reinterpret_cast<const uint4*>(kb + static_cast<int64_t>(key) * a.k_ss));
        vx[i] = __ldg(reinterpret_cast<const uint4*>(vb + static_cast<int64_t>(key) * a.v_ss));
        bx[i] = mrow ? to_f32(mrow[key]) : 0.f;
      } else {
        kx[i] = make_uint4(0, 0, 0, 0);
        vx[i] = make_uint4(0, 0, 0, 0);
        bx[i] = -INFINITY;
      }
    }
  };

  uint4 kr[kIt], vr[kIt];
  float bias[kIt];
  load(0, kr, vr, bias);
  // Query rows (row r: head g·n_rep + r/T, token r%T), this lane's 8 columns; rows past R are 0.
  float q[RB][8];
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    if (r < R) {
      const int64_t h = g * n_rep + r / nT;
      const T* qp = static_cast<const T*>(a.q) + b * a.q_sb + h * a.q_sh + (r % nT) * a.q_st + dc * 8;
#pragma unroll
      for (int e = 0; e < 8; ++e) q[r][e] = to_f32(qp[e]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) q[r][e] = 0.f;
    }
  }

  float m_run[RB], l_p[RB], o[RB][8];
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    m_run[r] = -INFINITY;
    l_p[r] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[r][e] = 0.f;
  }

  for (int c = 0; c < n_steps; ++c) {
    uint4 kn[kIt], vn[kIt];
    float bn[kIt];
    if (c + 1 < n_steps) {
      load(c + 1, kn, vn, bn);
    } else {
#pragma unroll
      for (int i = 0; i < kIt; ++i) {
        kn[i] = make_uint4(0, 0, 0, 0);
        vn[i] = make_uint4(0, 0, 0, 0);
        bn[i] = -INFINITY;
      }
    }
    // Scores of the lane's keys (the same in the kLpk lanes of a key after the shuffles).
    float s[kIt][RB];
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      float kf[8];
      unpack8<T>(kr[i], kf);
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        float acc = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc = fmaf(q[r][e], kf[e], acc);
#pragma unroll
        for (int x = 1; x < kLpk; x <<= 1) acc += __shfl_xor_sync(kFull, acc, x);
        const float bi = kRowMask ? __shfl_sync(kFull, bias[i], r, kLpk) : bias[i];  // lane r of the key
        s[i][r] = acc * a.scale + bi;  // bias −inf → −inf (acc is finite: zero rows past the end)
      }
    }
    // Online softmax per row; the step's max is the warp's (xor kLpk.. crosses its keys).
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      float cm = s[0][r];
#pragma unroll
      for (int i = 1; i < kIt; ++i) cm = fmaxf(cm, s[i][r]);
#pragma unroll
      for (int x = kLpk; x < 32; x <<= 1) cm = fmaxf(cm, __shfl_xor_sync(kFull, cm, x));
      const float m_new = fmaxf(m_run[r], cm);
      const bool dead = m_new == -INFINITY;  // only −inf scores seen so far
      const float alpha = dead ? 1.f : expf(m_run[r] - m_new);
      float ps = 0.f;
#pragma unroll
      for (int i = 0; i < kIt; ++i) {
        const float p = dead ? 0.f : expf(s[i][r] - m_new);
        s[i][r] = p;
        ps += p;
      }
      l_p[r] = fmaf(l_p[r], alpha, ps);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[r][e] *= alpha;
      m_run[r] = m_new;
    }
    // o += p · v over the lane's keys, its 8 columns.
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      float vf[8];
      unpack8<T>(vr[i], vf);
#pragma unroll
      for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e) o[r][e] = fmaf(s[i][r], vf[e], o[r][e]);
    }
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      kr[i] = kn[i];
      vr[i] = vn[i];
      bias[i] = bn[i];
    }
  }

  // Sum over the warp's keys (one max per warp, so plain sums), then the warp's partial to shared.
#pragma unroll
  for (int r = 0; r < RB; ++r) {
#pragma unroll
    for (int x = kLpk; x < 32; x <<= 1) {
      l_p[r] += __shfl_xor_sync(kFull, l_p[r], x);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[r][e] += __shfl_xor_sync(kFull, o[r][e], x);
    }
  }
  if (grp == 0) {
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      float4* dst = reinterpret_cast<float4*>(&o_s[warp][r][dc * 8]);
      dst[0] = make_float4(o[r][0], o[r][1], o[r][2], o[r][3]);
      dst[1] = make_float4(o[r][4], o[r][5], o[r][6], o[r][7]);
    }
    if (dc == 0) {
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        m_s[warp][r] = m_run[r];
        l_s[warp][r] = l_p[r];
      }
    }
  }
  __syncthreads();

  // The 4 warps merged per (row, 4 columns), warps in order, and the split's result stored.
  da_warps::merge_warps_store<T, D, kWarps, kThreads>(a, m_s, l_s, o_s, R, tid, bh, split, b, g, n_rep, nT);
}

// Merge of the n_split partial results (workspace → out) for every split kernel. Workspace
// layout: accumulators [B·Hkv][n_split][R][D], then (max, sum) pairs [B·Hkv][n_split][R]. Block =
// one query row r of (batch row, kv head) bh, kMergeGroups·D/2 threads: thread (group q, column
// pair d, d + 1) folds the splits s ≡ q (mod kMergeGroups) in order, kMergeChunk at a time (their
// loads issued together: one memory round trip per chunk, not one per split), with an online
// rescale by its own running max; the groups' (max, sum, accumulators) then combine in group order
// through shared memory. Deterministic (a fixed order throughout). Was one thread per column pair
// walking every split (8 blocks for the 1B shape, ~0.2 µs per split: ~13 µs at 64 splits).
constexpr int kMergeGroups = 8;
constexpr int kMergeChunk = 8;
template <int D>
constexpr int kMergeThreads = kMergeGroups * D / 2;

template <typename T, int D>
__global__ void __launch_bounds__(kMergeThreads<D>) merge_kernel(const DecodeAttentionArgs a) {
  constexpr int kPairs = D / 2;
  __shared__ float4 part_s[kMergeGroups][kPairs];  // (max, sum, acc d, acc d + 1) per group
  pdl_launch_dependents();
  pdl_wait();
  const int64_t n_rep = a.H / a.Hkv;
  const int nT = static_cast<int>(a.T);
  const int R = static_cast<int>(n_rep) * nT;
  const int ns = a.plan.n_split;
  const int64_t bh = blockIdx.x / R;
  const int r = static_cast<int>(blockIdx.x % R);
  const int tid = static_cast<int>(threadIdx.x);
  const int q = tid / kPairs, pr = tid % kPairs, d = 2 * pr;
  const float2* ml = reinterpret_cast<const float2*>(a.workspace + a.B * a.Hkv * ns * R * D) + bh * ns * R + r;
  const float* o = a.workspace + (bh * ns * R + r) * D + d;  // split s adds s·R·D
  float M = -INFINITY, den = 0.f, n0 = 0.f, n1 = 0.f;
  for (int s0 = q; s0 < ns; s0 += kMergeGroups * kMergeChunk) {
    float2 mlv[kMergeChunk], ov[kMergeChunk];
#pragma unroll
    for (int i = 0; i < kMergeChunk; ++i) {
      const int s = s0 + i * kMergeGroups;
      mlv[i] = s < ns ? ml[static_cast<int64_t>(s) * R] : make_float2(-INFINITY, 0.f);
      ov[i] = s < ns ? *reinterpret_cast<const float2*>(o + static_cast<int64_t>(s) * R * D) : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < kMergeChunk; ++i) {
      const float m = mlv[i].x;
      if (m == -INFINITY) continue;  // a split that saw only −inf keys weighs 0
      if (m > M) {
        const float sc = M == -INFINITY ? 0.f : expf(M - m);
        den = fmaf(den, sc, mlv[i].y);
        n0 = fmaf(n0, sc, ov[i].x);
        n1 = fmaf(n1, sc, ov[i].y);
        M = m;
      } else {
        const float w = expf(m - M);
        den = fmaf(w, mlv[i].y, den);
        n0 = fmaf(w, ov[i].x, n0);
        n1 = fmaf(w, ov[i].y, n1);
      }
    }
  }
  part_s[q][pr] = make_float4(M, den, n0, n1);
  __syncthreads();
  if (q != 0) return;
  float Mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMergeGroups; ++i) Mx = fmaxf(Mx, part_s[i][pr].x);
  float D0 = 0.f, N0 = 0.f, N1 = 0.f;
#pragma unroll
  for (int i = 0; i < kMergeGroups; ++i) {
    const float4 pt = part_s[i][pr];
    const float w = pt.x == -INFINITY ? 0.f : expf(pt.x - Mx);
    D0 = fmaf(w, pt.y, D0);
    N0 = fmaf(w, pt.z, N0);
    N1 = fmaf(w, pt.w, N1);
  }
  const int64_t b = bh / a.Hkv, g = bh % a.Hkv;
  const int64_t h = g * n_rep + r / nT;
  Vec<T, 2> y;
  y.v[0] = from_f32<T>(D0 > 0.f ? N0 / D0 : 0.f);
  y.v[1] = from_f32<T>(D0 > 0.f ? N1 / D0 : 0.f);
  *reinterpret_cast<Vec<T, 2>*>(static_cast<T*>(a.out) + b * a.o_sb + h * a.o_sh + (r % nT) * a.o_st + d) = y;
}

}  // namespace hearth::kernels::da_regs
