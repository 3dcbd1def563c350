// The decode GEMV for MLX affine 4/8-bit weights, LoRA terms included (kernels/gemv.cu's gemv(),
// its only includer besides bench/gemv_affine_bench.cu through it; device code in gemv.cu's anonymous
// namespace, after Segs, NormDev and stage_normed_x). A LoRA term (M = 1) is added by the row
// group's first warp after the base sum is complete, as gemv.cu's kernel adds it.
//
// Shape of the work: a warp owns kAffineRows (4) rows of W, and 2^wk_log2 warps of the block split
// those rows' chunks (a row group); lane t of the group's warp k walks chunks k·32 + t + i·32·2^wk_log2
// in tiles of kAffineTile (2) chunks per row — all 4·2 loads of a tile issued before any use. A lane
// loads x for a chunk once (from L1, or the staged normed x in shared memory) and dots it with its 4
// rows' chunks, where gemv.cu's kernel gave a row one warp and re-read x per row: 64 bytes of x per
// 16-byte chunk there (128 from shared memory as fp32, after every block had staged all of x),
// 16 here. The codes enter the FMA as fp32 subnormals: the code c masked in place at bit p of its
// word is the float c·2^(p−149), and x is pre-scaled by 2^(64−p), so a code costs a mask and an
// FMA (fma.rn.f32: subnormals kept whatever the compiler's flush-to-zero setting) instead of a
// byte_perm, a subtraction and an FMA; the product c·x·2^-85 is rounded exactly as c·x is (a power
// of two apart) while |c·x| ≥ 2^-41 (below that, an absolute error under 2^-64), and the chunk's dot
// is scaled back by 2^85 before the scale and bias. |x| must stay below 2^63 (9.2e18), far past any
// activation; beyond it the pre-scaled x overflows to inf.
//
// Measured (bench/gemv_affine_bench.cu, H200, bf16 x, 4-bit, group 64, M = 1, µs per launch in a
// CUDA graph over weights that do not fit L2, 2026-12-04), gemv.cu's kernel → this layout with
// 2^wk_log2 = 2: Llama-3.1-8B q/k/v 12.0 → 8.2, o 7.3 → 5.0, gate/up 46.0 → 31.1, down 26.5 → 15.6,
// lm_head 193 → 128 (2.1–2.3 TB/s); 1B o 3.65 → 2.09, down 8.1 → 7.0 (2 warps) / 5.6 (2 rows of 4
// chunks a lane); 1B gate/up 13.3 → 10.2 and lm_head 91 → 71 with one warp per row group (the
// warps per row group: affine_wk_log2). The
// same codes and scales without the subnormal trick: 8B down 18.9, gate/up 38.0. At M = 4 the
// 1B gate/up 55.3 → 23.7 µs. Sums: per (row, row of x) in chunk order per lane, then the lanes by xor
// shuffles, then the group's warps in order — fixed by `in`, the format and the segment's rows,
// not by M, the other segments of a launch or the grid.
#pragma once

namespace hearth::kernels {
namespace {

constexpr int kAffineRows = 4;  // rows of W per warp
constexpr int kAffineTile = 2;  // chunks per row a lane loads before using any

// Bit where the masked code of word position j starts (the mask leaves it in place below bit 23,
// so it is a subnormal's mantissa): 4-bit codes 0..4 in the word, 5..7 after a shift by 12; 8-bit
// codes 0..1 in the word, 2..3 after a shift by 16.
template <int Bits>
__host__ __device__ constexpr int subnormal_code_bit(int j) {
  return Bits == 4 ? (j <= 4 ? 4 * j : 4 * j - 12) : (j & 1) * 8;
}

// 2^(64 − subnormal_code_bit(j)): the pre-scale of x for code position j of a word.
template <int Bits>
__device__ __forceinline__ float subnormal_prescale(int j) {
  return __uint_as_float(static_cast<uint32_t>(127 + 64 - subnormal_code_bit<Bits>(j)) << 23);
}

__device__ __forceinline__ float fma_keep_subnormal(float a, float b, float c) {
  float d;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}

// Σ_k c_k · xp_k over one 16-byte chunk of codes, xp = x pre-scaled per position (subnormal_prescale):
// c·x·2^-85 summed; the caller multiplies by 2^85. Two accumulators, alternating codes.
template <int Bits>
__device__ __forceinline__ float chunk_dot_subnormal(const uint4& w, const float* xp) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  constexpr int kPerWord = 32 / Bits;
  constexpr uint32_t kMask = (1u << Bits) - 1;
  float d[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t v = words[i], v2 = v >> (Bits == 4 ? 12 : 16);
#pragma unroll
    for (int j = 0; j < kPerWord; ++j) {
      const uint32_t src = (Bits == 4 ? j <= 4 : j <= 1) ? v : v2;
      const uint32_t code = src & (kMask << subnormal_code_bit<Bits>(j));
      d[j & 1] = fma_keep_subnormal(__uint_as_float(code), xp[i * kPerWord + j], d[j & 1]);
    }
  }
  return d[0] + d[1];
}

// 2^85: undoes the subnormal scaling (2^-149 · 2^64).
constexpr float kSubnormalUnscale = 38685626227668133590597632.0f;

// The affine kernel. segs.tpr_log2[s] holds segment s's wk_log2 (warps per row group, log2 0..3);
// its blocks hold (8 >> wk_log2) row groups of kAffineRows rows. With nd.on the block first stages
// the normed x (stage_normed_x) as fp32 in its padded chunk slots of dynamic shared memory.
template <typename TX, typename TS, int Bits, int MaxM, bool Lora>
__global__ void __launch_bounds__(kThreads)
    gemv_affine_kernel(const TX* __restrict__ x, const Segs segs, int M, int in, int group_shift, const NormDev nd) {
  constexpr int kCodes = 128 / Bits;
  constexpr int kStride = smem_chunk_stride<TX, Bits>();
  constexpr int kR = kAffineRows, kU = kAffineTile;
  extern __shared__ float gemv_smem[];
  __shared__ float part[kWarps][kR * MaxM];
  pdl_launch_dependents();
  const SegView<TS> sg = segment_of<TS>(segs, blockIdx.x);
  const int si = sg.si;
  const uint4* __restrict__ wv = sg.w;
  const TS* __restrict__ sv = sg.s;
  const TS* __restrict__ bv = sg.b;
  const int64_t out = sg.out;
  const int wk_log2 = sg.log2;  // block-uniform
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int grp = warp >> wk_log2, kw = warp & ((1 << wk_log2) - 1);
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x - sg.first) * (kWarps >> wk_log2) + grp) * kR;
  const int chunks = in / kCodes;
  const int64_t gpr = in >> group_shift;  // scale groups per row
  const int step = 32 << wk_log2;         // a lane's stride in chunks

  uint4 w[kU][kR];
  float sc[kU][kR], bi[kU][kR];
  auto load_tile = [&](int c0) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + u * step;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const bool ok = c < chunks && row0 + r < out;
        const int64_t rr = ok ? row0 + r : 0;
        const int cc = ok ? c : 0;
        w[u][r] = ld16_ordered(wv + rr * chunks + cc, ok);
        const int64_t g = rr * gpr + ((cc * kCodes) >> group_shift);
        sc[u][r] = ok ? to_f32(sv[g]) : 0.f;
        bi[u][r] = ok ? to_f32(bv[g]) : 0.f;
      }
    }
  };
  const int cs = kw * 32 + lane;
  if (cs < chunks) load_tile(cs);  // weights only: before pdl_wait
  // The LoRA term's B (GemvSegment::lora_*; the Lora instance, M = 1): the group's first warp adds
  // Σ_j B[row, j]·h[j] for its rows, lane t taking j = t, t + 32, …; the first share of B (a weight)
  // is loaded here, before pdl_wait, h (an earlier kernel's output) after it.
  const int lrank = Lora ? pick(si, segs.lora_rank[0], segs.lora_rank[1], segs.lora_rank[2]) : 0;  // block-uniform
  const TX* __restrict__ lbv = Lora ? static_cast<const TX*>(pick(si, segs.lora_b[0], segs.lora_b[1], segs.lora_b[2])) : nullptr;
  float lb[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r)
    lb[r] = Lora && kw == 0 && lane < lrank && row0 + r < out ? to_f32(lbv[(row0 + r) * lrank + lane]) : 0.f;
  pdl_wait();
  if (nd.on) {
    stage_normed_x<TX, Bits>(x, nd, M, in, gemv_smem);
    __syncthreads();
  }

  float acc[kR][MaxM];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int m = 0; m < MaxM; ++m) acc[r][m] = 0.f;
  for (int c0 = cs; c0 < chunks; c0 += step * kU) {
    if (c0 != cs) load_tile(c0);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + u * step;
      if (c >= chunks) break;
#pragma unroll
      for (int m = 0; m < MaxM; ++m) {
        if (m >= M) break;
        float xf[kCodes];
        if (nd.on) {
          const float4* p = reinterpret_cast<const float4*>(gemv_smem + (m * chunks + c) * kStride);
#pragma unroll
          for (int q = 0; q < kCodes / 4; ++q) {
            const float4 v = p[q];
            xf[4 * q] = v.x, xf[4 * q + 1] = v.y, xf[4 * q + 2] = v.z, xf[4 * q + 3] = v.w;
          }
        } else {
          load_x_ordered<TX, kCodes>(x + static_cast<int64_t>(m) * in + static_cast<int64_t>(c) * kCodes, xf);
        }
        float xs = 0.f;  // Σx of the chunk, in index order
#pragma unroll
        for (int k = 0; k < kCodes; ++k) xs += xf[k];
#pragma unroll
        for (int k = 0; k < kCodes; ++k) xf[k] *= subnormal_prescale<Bits>(k % (32 / Bits));
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          const float d = chunk_dot_subnormal<Bits>(w[u][r], xf) * kSubnormalUnscale;
          acc[r][m] += sc[u][r] * d + bi[u][r] * xs;
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int m = 0; m < MaxM; ++m)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
  if (wk_log2 > 0) {  // block-uniform: the group's warps meet in shared memory, added in warp order
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int m = 0; m < MaxM; ++m) part[warp][r * MaxM + m] = acc[r][m];
    }
    __syncthreads();
    if (kw == 0 && lane == 0) {
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int m = 0; m < MaxM; ++m) {
          float v = part[warp][r * MaxM + m];
          for (int k = 1; k < (1 << wk_log2); ++k) v += part[warp + k][r * MaxM + m];
          acc[r][m] = v;
        }
    }
  }
  if (Lora && lrank > 0 && kw == 0) {  // warp-uniform: the whole warp shuffles
    // Σ_j B[row, j]·h[j] (fixed order for a rank), scaled onto the complete base sum: one rounding
    // for both, as addmm's.
    const TX* __restrict__ hv = static_cast<const TX*>(pick(si, segs.lora_h[0], segs.lora_h[1], segs.lora_h[2]));
    const float ls = pick(si, segs.lora_scale[0], segs.lora_scale[1], segs.lora_scale[2]);
    const float h0 = lane < lrank ? to_f32(hv[lane]) : 0.f;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      float lp = lb[r] * h0;
      if (row0 + r < out)
        for (int j = lane + 32; j < lrank; j += 32) lp = fmaf(to_f32(lbv[(row0 + r) * lrank + j]), to_f32(hv[j]), lp);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) lp += __shfl_xor_sync(0xffffffffu, lp, o);
      acc[r][0] = fmaf(ls, lp, acc[r][0]);
    }
  }
  if (kw == 0 && lane == 0) {
    TX* __restrict__ y = static_cast<TX*>(pick(si, segs.y[0], segs.y[1], segs.y[2]));
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (row0 + r >= out) break;
#pragma unroll
      for (int m = 0; m < MaxM; ++m)
        if (m < M) y[static_cast<int64_t>(m) * out + row0 + r] = from_f32<TX>(acc[r][m]);
    }
  }
}

// Warps per row group (log2) of a segment of `rows` rows over `chunks` chunks: one warp, doubled
// while the segment has fewer than 256 blocks and a lane keeps a chunk. bench/gemv_affine_bench.cu
// (H200, 4-bit, M = 1, µs for 1/2/4/8 warps): 1B o (2,048 rows) 3.68/3.06/3.32/6.05, down (2,048 of
// 256 chunks) 13.5/7.9/5.5/8.0, gate/up (2 × 8,192) 10.0/13.8/24.5/44.2; 8B o (4,096) 7.6/5.4/7.4/12.4,
// down (4,096 of 448 chunks) 25.1/15.7/17.5/20.0, gate/up (2 × 14,336) 30.2/33.2/48.0/82.7, lm_head
// 121/136/205/360. A function of the segment alone, so a grouped launch gives each segment its own
// bits (the 8B's q/k/v as one launch ran best in one warp, 7.9 against 9.2 µs, which its segments
// of 4,096 and 1,024 rows do not choose alone).
inline int affine_wk_log2(int64_t chunks, int64_t rows) {
  auto blocks = [&](int wl) {
    const int64_t per = int64_t{kAffineRows} * (kWarps >> wl);
    return (rows + per - 1) / per;
  };
  int l = 0;
  while (l < 3 && blocks(l) < 256 && chunks >= (int64_t{32} << (l + 1))) ++l;
  return l;
}

// The affine kernel's static shared memory: its row groups' partial sums (MaxM = 8) and
// stage_normed_x's 8 floats. gemv.cu's normed_x_bytes keeps the staged x within 48 KB beside it.
constexpr int64_t kAffineStaticSmem = int64_t{sizeof(float)} * (kWarps * kAffineRows * 8 + kThreads / 32);

// Fills the segment table for gemv_affine_kernel and launches it. x is staged in shared memory only
// with the norm, in room gemv_supported has checked (normed_x_bytes).
template <typename TX, typename TS, int Bits>
const char* launch_affine(const GemvArgs& a) {
  Segs segs{};
  const int64_t chunks = a.in / (128 / Bits);
  const int64_t end = fill_segs(
      a, segs, [&](const GemvSegment& g) { return affine_wk_log2(chunks, g.out); },
      [](int l) { return int64_t{kAffineRows} * (kWarps >> l); });
  if (end < 0) return "gemv: too many output rows for one grid";
  const GemvNorm& g = a.norm;
  const NormDev nd{g.residual, g.sum, g.normed, g.weight, g.mode, g.offset, g.eps,
                   1.f / static_cast<float>(a.in), g.on ? 1 : 0};
  const size_t smem = g.on ? static_cast<size_t>(a.M * chunks * smem_chunk_stride<TX, Bits>() * 4) : 0;
  if (static_cast<int64_t>(smem) + kAffineStaticSmem > 48 * 1024) return "gemv: the normed rows do not fit the affine kernel's shared memory";
  const int group_shift = log2_exact(a.group_size);
  const dim3 grid(static_cast<unsigned>(end)), block(kThreads);
  const auto st = static_cast<cudaStream_t>(a.stream);
  const auto* x = static_cast<const TX*>(a.x);
  const int M = static_cast<int>(a.M), in = static_cast<int>(a.in);
  bool lora = false;
  for (int s = 0; s < a.n_seg; ++s) lora = lora || a.seg[s].lora_rank > 0;
  cudaError_t e;
  if (lora) e = launch_kernel(gemv_affine_kernel<TX, TS, Bits, 1, true>, grid, block, smem, st, x, segs, M, in, group_shift, nd);
  else if (M <= 1) e = launch_kernel(gemv_affine_kernel<TX, TS, Bits, 1, false>, grid, block, smem, st, x, segs, M, in, group_shift, nd);
  else if (M <= 2) e = launch_kernel(gemv_affine_kernel<TX, TS, Bits, 2, false>, grid, block, smem, st, x, segs, M, in, group_shift, nd);
  else if (M <= 4) e = launch_kernel(gemv_affine_kernel<TX, TS, Bits, 4, false>, grid, block, smem, st, x, segs, M, in, group_shift, nd);
  else e = launch_kernel(gemv_affine_kernel<TX, TS, Bits, 8, false>, grid, block, smem, st, x, segs, M, in, group_shift, nd);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace
}  // namespace hearth::kernels
