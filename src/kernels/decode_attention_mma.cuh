// The tensor-core split kernel of Hearth's decode attention (kernels/decode_attention.h) for
// bf16/fp16, head dim 64 or 128 and R = n_rep·T ≤ 16 query rows per kv head. Device code only,
// included by kernels/decode_attention.cu alone; it writes the same (o, m, l) workspace as the
// register kernel, so the merge kernel (kernels/decode_attention_regs.cuh) serves both.
//
// Why: the register kernel spends ~570 instructions per lane per 16 keys (dot products reduced by
// shuffles across the 8 lanes of a key, an exp per lane and row), so at long context it is bound
// by instruction issue, not memory. Here the two products are mma.sync m16n8k16 (fp32
// accumulate; PTX ISA, "Matrix Fragments for mma.m16n8k16"), as FlashAttention-2 does for prefill
// (Dao 2023): S = Q Kᵀ with the ≤ 16 query rows as the M dimension (rows past R are zeros), and
// O += P V with S's accumulator fragment reused as P's operand fragment (FA-2's register reuse).
//
// Shape of the work: block = split s of (batch row b, kv head g), 4 warps; per step of 64 keys
// warp w takes keys [16w, 16w + 16): two 8-key n-blocks for Q Kᵀ, one 16-key k-block for P V.
// Lane = 4·gr + t (gr = lane / 4, t = lane % 4), as in the PTX fragment tables.
//  - Head-dim order: a dot product does not depend on the order of its terms, so k-slot 2t, 2t+1,
//    2t+8, 2t+9 of head-dim block kb = 2u + x stands for d = 32u + 8t + 4x + 0, 1, 2, 3: lane t of
//    a key then holds 16-byte chunks 4u + t of the key's k row (a load instruction covers 64 whole
//    bytes of each of 8 keys), and the query rows in the same order (loaded once).
//  - Output-column order: column n of output n-block nb stands for d = n·D/8 + nb, so lane gr
//    holds the contiguous run [gr·D/8, (gr+1)·D/8) of the v rows of its 4 keys (2t, 2t+1, 2t+8,
//    2t+9 of the warp's 16; D/64 chunks each), paired into operands by byte permutes.
//  - P is split into hi = bf16/fp16(p) and lo = that type of (p − hi), two products per step, so
//    the weights keep ~16 bits (a single rounding of p to bf16 would cost ~2^-9 relative in each
//    weight; the register kernel keeps p in fp32). Scores, softmax, the sums and the merge are
//    fp32, as in the register kernel; q, k, v enter the products exactly.
//  - Loads straight into registers, the next step's issued before this step's products (D = 64;
//    D = 128 would need ~250 registers for that and loads each step just before its products).
//    Tried and slower: each lane streaming its chunks through shared memory with cp.async, 3–4
//    steps ahead (34.4 against 28.2 µs per layer at 32K keys, 6.7 against 5.9 at 704; H200).
// Online softmax per row: lane (gr, t) holds rows gr and gr + 8 for 2 keys of each n-block; the
// step's max over the 4 lanes of the quad (xor 1, 2). One __syncthreads at the end merges the 4
// warps through shared memory in fixed warp order. Keys past the split: k, v zeros (finite), bias
// −inf; masks, −inf handling and fully masked rows as in the register kernel (its header comment).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "decode_attention.h"
#include "decode_attention_warps.cuh"
#include "dtype.cuh"
#include "pdl.cuh"

namespace hearth::kernels::da_mma {

constexpr int kThreads = kDecodeAttentionThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kWarpKeys = 16;                     // keys per warp per step
constexpr int kStepKeys = kWarps * kWarpKeys;     // keys per block per step: 64
static_assert(kStepKeys == kDecodeAttentionMmaStepKeys, "host planning and device agree");

// d += a·b, m16n8k16, fp32 accumulators; a: 4 registers of 2 values, b: 2 registers.
template <typename T>
__device__ __forceinline__ void mma16816(float* d, const uint32_t* a, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (x, y) rounded to T and packed, x in the low half; and back.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float x, float y) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t w);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t w) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

__device__ __forceinline__ uint32_t word(const uint4& u, int i) { return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w; }

// Compile-time layout of one head dim.
template <int D>
struct Cfg {
  static constexpr int kKb = D / 16;    // head-dim blocks of Q Kᵀ
  static constexpr int kKu4 = D / 32;   // 16-byte chunks of a lane's k values per key (D/4 values)
  static constexpr int kNb = D / 8;     // output n-blocks of P V
  static constexpr int kVu4 = D / 64;   // 16-byte chunks of a lane's v run per key (D/8 values)
  static constexpr bool kPrefetch = D == 64;
  static constexpr int kOStride = D + 4;  // shared row of the warp merge (4-way bank spread)
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
};

// One step's loads of a lane: k chunks of its 2 keys (key 8j + gr; chunk 4u + t of the key's row),
// v runs of its 4 keys (2t, 2t+1, 2t+8, 2t+9), and the bias of the S fragment's keys (8j + 2t + e)
// for row gr and (own mask rows only) gr + 8.
template <int D, bool kRowMask>
struct Loads {
  uint4 k[2][Cfg<D>::kKu4];
  uint4 v[4][Cfg<D>::kVu4];
  float bias[2][2][kRowMask ? 2 : 1];
};

template <typename T, int D, bool kRowMask>
__global__ void __launch_bounds__(kThreads, D == 64 ? 3 : 2) split_kernel(const DecodeAttentionArgs a) {
  using C = Cfg<D>;
  using L = Loads<D, kRowMask>;
  static_assert(sizeof(T) == 2, "bf16 or fp16");
  __shared__ __align__(16) float o_s[kWarps][16][C::kOStride];
  __shared__ float m_s[kWarps][16], l_s[kWarps][16];

  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int gr = lane >> 2, t = lane & 3;
  const int split = static_cast<int>(blockIdx.x);
  const int64_t bh = blockIdx.y;
  const int64_t b = bh / a.Hkv, g = bh % a.Hkv;
  const int64_t n_rep = a.H / a.Hkv;
  const int nT = static_cast<int>(a.T);
  const int R = static_cast<int>(n_rep) * nT;  // ≤ 16
  const int S = static_cast<int>(a.S);
  const int k_begin = split * static_cast<int>(a.plan.keys_per_split);
  const int k_end = k_begin + static_cast<int>(a.plan.keys_per_split) < S ? k_begin + static_cast<int>(a.plan.keys_per_split) : S;
  const int n_steps = (k_end - k_begin + kStepKeys - 1) / kStepKeys;
  const T* __restrict__ kb = static_cast<const T*>(a.k) + b * a.k_sb + g * a.k_sh + 8 * t;
  const T* __restrict__ vb = static_cast<const T*>(a.v) + b * a.v_sb + g * a.v_sh + gr * (D / 8);
  // Mask rows of the lane's rows gr and gr + 8 (with kRowMask their tokens', else the one row).
  const T* mrow[2] = {nullptr, nullptr};
  if (a.mask) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = gr + 8 * h;
      const int tok = kRowMask ? (r < R ? r : 0) % nT : 0;
      mrow[h] = static_cast<const T*>(a.mask) + b * a.m_sb + tok * a.m_st;
    }
  }

  pdl_launch_dependents();
  pdl_wait();  // q, the cache's newest key and value, the mask come from earlier kernels

  auto load = [&](int c, L& x) {
    const int w0 = k_begin + c * kStepKeys + warp * kWarpKeys;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int key = w0 + 8 * j + gr;
#pragma unroll
      for (int u = 0; u < C::kKu4; ++u)
        x.k[j][u] = key < k_end ? __ldg(reinterpret_cast<const uint4*>(kb + static_cast<int64_t>(key) * a.k_ss + 32 * u))
                                : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = w0 + 2 * t + (i & 1) + 8 * (i >> 1);
#pragma unroll
      for (int u = 0; u < C::kVu4; ++u)
        x.v[i][u] = key < k_end ? __ldg(reinterpret_cast<const uint4*>(vb + static_cast<int64_t>(key) * a.v_ss + 8 * u))
                                : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = w0 + 8 * j + 2 * t + e;
#pragma unroll
        for (int h = 0; h < (kRowMask ? 2 : 1); ++h)
          x.bias[j][e][h] = key >= k_end ? -INFINITY : mrow[h] ? to_f32(mrow[h][key]) : 0.f;
      }
  };

  L cur;
  load(0, cur);
  // Query fragments (A of Q Kᵀ), rows gr and gr + 8 (zeros past R), in the k chunks' order: k-block
  // kb, pair p ↔ chunk 4·(kb/2) + t, values 4·(kb%2) + 2p, +1 (d = 32·(kb/2) + 8t + 4·(kb%2) + 2p).
  uint32_t qa[C::kKb][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = gr + 8 * h;
    const uint16_t* qp = nullptr;
    if (r < R) {
      const int64_t head = g * n_rep + r / nT;
      qp = reinterpret_cast<const uint16_t*>(static_cast<const T*>(a.q) + b * a.q_sb + head * a.q_sh +
                                             (r % nT) * a.q_st + 8 * t);
    }
#pragma unroll
    for (int kbk = 0; kbk < C::kKb; ++kbk)
#pragma unroll
      for (int p = 0; p < 2; ++p) {  // p = 0: k-slots 2t, 2t+1; p = 1: 2t+8, 2t+9
        const int d = 32 * (kbk / 2) + 4 * (kbk % 2) + 2 * p;
        qa[kbk][2 * p + h] = qp ? static_cast<uint32_t>(__ldg(qp + d)) | (static_cast<uint32_t>(__ldg(qp + d + 1)) << 16) : 0u;
      }
  }

  float o[C::kNb][4];
#pragma unroll
  for (int nb = 0; nb < C::kNb; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nb][e] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_p[2] = {0.f, 0.f};

  for (int c = 0; c < n_steps; ++c) {
    L nxt;
    if constexpr (C::kPrefetch) {
      if (c + 1 < n_steps) load(c + 1, nxt);
    } else if (c > 0) {
      load(c, cur);
    }
    // S = Q Kᵀ for the warp's 2 n-blocks: s[j][0, 1] row gr, keys 8j + 2t, +1; s[j][2, 3] row gr + 8.
    float s[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
#pragma unroll
      for (int u = 0; u < C::kKu4; ++u) {
        mma16816<T>(s[j], qa[2 * u], cur.k[j][u].x, cur.k[j][u].y);
        mma16816<T>(s[j], qa[2 * u + 1], cur.k[j][u].z, cur.k[j][u].w);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = s[j][e] * a.scale + cur.bias[j][e & 1][kRowMask ? e >> 1 : 0];
    }
    // Online softmax per row (h = 0: row gr, 1: row gr + 8); the step's max over the quad.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float cm = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
      cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
      cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 2));
      const float m_new = fmaxf(m_run[h], cm);
      const bool dead = m_new == -INFINITY;  // only −inf scores seen so far
      const float alpha = dead ? 1.f : expf(m_run[h] - m_new);
      float ps = 0.f;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = dead ? 0.f : expf(s[j][2 * h + e] - m_new);
          s[j][2 * h + e] = p;
          ps += p;
        }
      l_p[h] = fmaf(l_p[h], alpha, ps);
#pragma unroll
      for (int nb = 0; nb < C::kNb; ++nb) {
        o[nb][2 * h] *= alpha;
        o[nb][2 * h + 1] *= alpha;
      }
      m_run[h] = m_new;
    }
    // P as the A fragment of P V (FA-2: a0 = S n-block 0 row gr, a1 = row gr + 8, a2/a3 n-block 1),
    // split into hi + lo.
    uint32_t ph[4], pl[4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float x = s[j][2 * h], y = s[j][2 * h + 1];
        const uint32_t hi = pack2<T>(x, y);
        const float2 hf = unpack2<T>(hi);
        ph[2 * j + h] = hi;
        pl[2 * j + h] = pack2<T>(x - hf.x, y - hf.y);
      }
    // O += P V: output n-block nb, column n ↔ d = n·D/8 + nb; b0 pairs keys 2t, 2t+1, b1 2t+8, 2t+9.
#pragma unroll
    for (int nb = 0; nb < C::kNb; ++nb) {
      const int u = nb / 8, wi = (nb % 8) / 2;
      const unsigned sel = nb % 2 ? 0x7632u : 0x5410u;
      const uint32_t b0 = __byte_perm(word(cur.v[0][u], wi), word(cur.v[1][u], wi), sel);
      const uint32_t b1 = __byte_perm(word(cur.v[2][u], wi), word(cur.v[3][u], wi), sel);
      mma16816<T>(o[nb], ph, b0, b1);
      mma16816<T>(o[nb], pl, b0, b1);
    }
    if constexpr (C::kPrefetch) cur = nxt;
  }

  // The quad's partial sums; the warp's (max, sum, accumulator) to shared memory. o[nb][0, 1]:
  // row gr, d = 2t·D/8 + nb and (2t+1)·D/8 + nb; o[nb][2, 3]: row gr + 8.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_p[h] += __shfl_xor_sync(0xffffffffu, l_p[h], 1);
    l_p[h] += __shfl_xor_sync(0xffffffffu, l_p[h], 2);
#pragma unroll
    for (int nb = 0; nb < C::kNb; ++nb) {
      o_s[warp][gr + 8 * h][2 * t * (D / 8) + nb] = o[nb][2 * h];
      o_s[warp][gr + 8 * h][(2 * t + 1) * (D / 8) + nb] = o[nb][2 * h + 1];
    }
    if (t == 0) {
      m_s[warp][gr + 8 * h] = m_run[h];
      l_s[warp][gr + 8 * h] = l_p[h];
    }
  }
  __syncthreads();

  // The 4 warps merged per (row, 4 columns), warps in order, and the split's result stored.
  da_warps::merge_warps_store<T, D, kWarps, kThreads>(a, m_s, l_s, o_s, R, tid, bh, split, b, g, n_rep, nT);
}

}  // namespace hearth::kernels::da_mma
