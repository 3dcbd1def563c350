// The end both split kernels of the decode attention share (kernels/decode_attention_mma.cuh,
// decode_attention_regs.cuh): a block's warps each hold a partial softmax state of the same rows over
// their own keys; this merges them and stores the split's result. Device code only, included by
// decode_attention.cu through the two kernel headers.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "decode_attention.h"
#include "dtype.cuh"

namespace hearth::kernels::da_warps {

/// Merges the kWarps warps' states — running max m_s[w][r], sum l_s[w][r] and unnormalised output
/// o_s[w][r][0..D) — per (row r < R, 4 columns c4..c4+3), warps in order (FA-2's rescale: weight
/// exp(m_w − max), a warp with no key, m = −inf, weighs 0), then stores: with one split the output
/// row O/L in T (0 where L = 0) at out[b, g·n_rep + r / nT, r % nT, c4]; else the fp32 O row into
/// the split's workspace row and (max, L) into the (max, sum) table after the rows. Every thread of
/// the block calls it (kThreads of them) after the barrier that completes the shared arrays.
template <typename T, int D, int kWarps, int kThreads, int Rows, int Stride>
__device__ __forceinline__ void merge_warps_store(const DecodeAttentionArgs& a, const float (&m_s)[kWarps][Rows],
                                                  const float (&l_s)[kWarps][Rows],
                                                  const float (&o_s)[kWarps][Rows][Stride], int R, int tid,
                                                  int64_t bh, int split, int64_t b, int64_t g, int64_t n_rep, int nT) {
  static_assert(D % 4 == 0 && Stride >= D, "whole column quads");
  constexpr int kQuads = D / 4;
  const int64_t row0 = (bh * a.plan.n_split + split) * R;  // workspace row of (bh, split, r = 0)
  for (int p = tid; p < R * kQuads; p += kThreads) {
    const int r = p / kQuads, c4 = (p % kQuads) * 4;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_s[w][r]);
    float L = 0.f, O[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = m_s[w][r];
      const float wt = mw == -INFINITY ? 0.f : expf(mw - M);
      L = fmaf(wt, l_s[w][r], L);
      const float4 ow = *reinterpret_cast<const float4*>(&o_s[w][r][c4]);
      O[0] = fmaf(wt, ow.x, O[0]);
      O[1] = fmaf(wt, ow.y, O[1]);
      O[2] = fmaf(wt, ow.z, O[2]);
      O[3] = fmaf(wt, ow.w, O[3]);
    }
    if (a.plan.n_split == 1) {
      __align__(8) T y[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) y[x] = from_f32<T>(L > 0.f ? O[x] / L : 0.f);
      const int64_t h = g * n_rep + r / nT;
      T* dst = static_cast<T*>(a.out) + b * a.o_sb + h * a.o_sh + (r % nT) * a.o_st + c4;
      *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(y);
    } else {
      *reinterpret_cast<float4*>(a.workspace + (row0 + r) * D + c4) = make_float4(O[0], O[1], O[2], O[3]);
      if (c4 == 0) {
        float2* ml = reinterpret_cast<float2*>(a.workspace + a.B * a.Hkv * a.plan.n_split * R * D);
        ml[row0 + r] = make_float2(M, L);
      }
    }
  }
}

}  // namespace hearth::kernels::da_warps
