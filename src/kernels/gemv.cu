// Decode GEMV for dense and MLX affine 4/8-bit weights (kernels/gemv.h): y = x · Wᵀ for M ≤ 8 rows
// of x, up to three weights sharing x in one launch. No ATen: it compiles standalone (`nvcc -c`).
// Affine launches go to kernels/gemv_affine.cuh (its own layout and numbers, LoRA terms included);
// what follows is the kernel of dense launches. (The affine weights' first kernel was this one with
// the codes' scales and biases beside each tile and x staged in shared memory; its measurements are
// in docs/benchmarks.md.)
//
// Shape of the work (decode reads every weight byte once, so the aim is bytes in flight and enough
// warps to cover the memory latency): each row belongs to `tpr` lanes (4..256: a row of more than 32
// lanes spans 2, 4 or 8 whole warps of the 256-thread block). Lane t of a row takes the row's 16-byte
// chunks t, t + tpr, t + 2·tpr, … in tiles of U chunks (U = 2, 4 or 8), issues a tile's loads before using any, then dots them with every row of x. The
// first tile goes out before pdl_wait (weights only; x and y after it).
//
// The loads are inline PTX (ld16_ordered below) because ptxas sinks __ldg (ld.global.nc) loads down
// to their use, so "a tile of loads before any use" in the source was not what ran: bench/
// gemv_bench.cu, H200, 1B shape, M = 1, bf16, PDL on, µs per launch in a CUDA graph over weight copies
// that do not fit L2 — the __ldg kernel (one warp per 2048-wide row, 8 chunks a lane) against the
// same layout with ordered loads: qkv 2048→2048+512+512 5.07 → 4.08, o 2048→2048 4.14 → 3.15,
// gate/up 2048→2×8192 18.67 → 16.95, down 8192→2048 16.27 → 13.61, lm_head 2048→128256 117.9 → 116.8.
//
// Lanes per row (lanes_log2): dense rows of one warp's tile or less keep one warp or fewer lanes
// (~8 chunks a lane); longer rows spread over up to 8 warps, at most kDenseChunksPerLane (4) chunks a
// lane. In the whole 1B step (H200, HEARTH_GRAPH_PROFILE, 2026-12-03) the 2048-wide rows over 128
// lanes of 2 chunks lost to one warp of 8 (gate/up 31.0 µs a layer against 20.4; lm_head ~134
// against 118; q/k/v 5.0–6.3 against 4.4–4.9) while the 8192-wide down projection over 256 lanes of
// 4 won (10.5–12.9 µs against 16.3), although the isolated bench below had favoured the split rows
// for all of them. The bench's split-K candidate (a row over S warps of U chunks a lane, each warp a
// contiguous slice where gemv() interleaves its lanes over the whole row: the same 512 bytes per
// warp-wide load), same machine and setup: o S=4 U=2 2.87 µs, gate/up S=4 U=2 16.29, down S=8 U=4
// 9.10 (S=4 U=8 10.15; one warp with 16-chunk tiles 10.40), lm_head S=4 U=2 115.9 — each the best
// of its shape; qkv ran best in one warp (4.08; S=2 U=4 4.34). This rule (one warp for 2048-wide
// rows, 256 lanes of 4 for 8192) is built from those step measurements; the step with it (H200,
// 2026-12-04): 1,138.2 µs against 1,274.6 (gate/up 20.0–25.6 µs, down 10.5–11.6, o 3.5–5.7, lm_head
// ~120), 806 tok/s against 742. x is read per chunk from L1/L2, except in a launch that normalises
// it (GemvNorm): each block then stages the normed x once in shared memory as fp32 (padded per chunk
// so a warp's 16-byte reads hit distinct banks).
//
// A row's partial sums meet by xor shuffles inside each warp, then (rows over several warps) through
// shared memory, added in warp order: an order fixed by `in`, the format and the segment's row count
// (not by U, which only moves loads), so a row's result does not depend on M, on the other segments
// of a grouped launch or on the grid. (The affine kernel keeps the same property with its own order.)
// LoRA term (GemvSegment::lora_*, one row of x): after a row's sum is complete, its first lanes add
// Σ_j B[row, j]·h[j] (h = x·Aᵀ from an earlier, small launch) times the scale before the one
// rounding — nn::Linear's inference path for an active adapter: one extra launch per group of
// Linears sharing x instead of two cuBLAS calls per adapter (H200, 1B bf16, rank 8, 2026-12-04:
// 413 → 705–731 tok/s against 843–862 without an adapter). A separate instance (Lora = true).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "dtype.cuh"
#include "gemv.h"
#include "gemv_chunk.cuh"
#include "pdl.cuh"
#include "rms_row.cuh"

namespace hearth::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 8;  // the deepest tile: chunks loaded before any use
constexpr int kMaxLanesLog2 = 8;  // a row over at most the block's 8 warps
// Dense rows longer than one warp's tile spread over warps until a lane has at most this many
// chunks (8192-wide bf16: 256 lanes of 4). The numbers at the top of the file.
constexpr int kDenseChunksPerLane = 4;

// The segments of one launch, selected per block by comparing blockIdx.x with block_end (unused
// segments end at UINT32_MAX so nothing selects them).
struct Segs {
  const void* w[3];
  const void* s[3];
  const void* b[3];
  void* y[3];
  int64_t out[3];
  unsigned block_end[3];
  int tpr_log2[3];  // lanes per row of each segment's blocks, log2 (2..8)
  const void* lora_b[3];  // GemvSegment's LoRA term (rank 0: none)
  const void* lora_h[3];
  int lora_rank[3];
  float lora_scale[3];
};

template <typename T>
__device__ __forceinline__ T pick(int i, T a, T b, T c) {
  return i == 0 ? a : i == 1 ? b : c;
}

// A block's segment: its index si, the segment's first block, weights, scales, biases, rows and
// tpr_log2 (block-uniform values). y and the LoRA terms are picked by si where they are used.
template <typename TS>
struct SegView {
  int si;
  unsigned first;
  const uint4* w;
  const TS* s;
  const TS* b;
  int64_t out;
  int log2;
};

template <typename TS>
__device__ __forceinline__ SegView<TS> segment_of(const Segs& segs, unsigned bid) {
  const int si = (bid >= segs.block_end[0]) + (bid >= segs.block_end[1]);
  return {si,
          pick(si, 0u, segs.block_end[0], segs.block_end[1]),
          static_cast<const uint4*>(pick(si, segs.w[0], segs.w[1], segs.w[2])),
          static_cast<const TS*>(pick(si, segs.s[0], segs.s[1], segs.s[2])),
          static_cast<const TS*>(pick(si, segs.b[0], segs.b[1], segs.b[2])),
          pick(si, segs.out[0], segs.out[1], segs.out[2]),
          pick(si, segs.tpr_log2[0], segs.tpr_log2[1], segs.tpr_log2[2])};
}

// Floats one chunk of x takes in shared memory: its kCodes values and 4 of padding, so lanes that read
// consecutive chunks with 16-byte loads start 4 banks apart.
template <typename TX, int Kind>
__host__ __device__ constexpr int smem_chunk_stride() {
  return codes_per_chunk<TX, Kind>() + 4;
}

// GemvNorm as the kernel takes it (typed pointers resolved at launch; inv_c = 1/in as rms_norm's).
struct NormDev {
  const void* residual;
  void* sum;
  void* normed;
  const void* weight;
  NormWeight mode;
  float offset, eps, inv_c;
  int on;
};

// The normed-x prologue: the M rows of norm(x (+ residual)) computed as rms_norm_kernel computes
// them (rms_row.cuh: the same per-thread order, block sum and roundings, so the same bits), staged
// as fp32 in x's padded chunk slots of shared memory; block 0 also stores the sum and the normed
// row. Every thread of the block calls it; the caller syncs before the staged values are read.
template <typename TX, int Kind>
__device__ void stage_normed_x(const TX* __restrict__ x, const NormDev& n, int M, int in, float* xs) {
  static_assert(kThreads == kRmsRowThreads, "the GEMV block walks a row as rms_norm_kernel does");
  constexpr int kCodes = codes_per_chunk<TX, Kind>();
  constexpr int kStride = smem_chunk_stride<TX, Kind>();
  __shared__ float part[kThreads / 32];
  const int chunks = in / kCodes;
  const bool writer = blockIdx.x == 0;
  const TX* __restrict__ res = static_cast<const TX*>(n.residual);
  const TX* __restrict__ w = static_cast<const TX*>(n.weight);
  TX* const sum = static_cast<TX*>(n.sum);
  TX* const normed = static_cast<TX*>(n.normed);
  for (int m = 0; m < M; ++m) {
    const int64_t base = static_cast<int64_t>(m) * in;
    float ss = 0.f;
    for (int i = static_cast<int>(threadIdx.x); i < in; i += kThreads) {
      float h = to_f32(x[base + i]);
      if (res) {
        const TX s = from_f32<TX>(h + to_f32(res[base + i]));  // torch's add: fp32 opmath, one rounding
        h = to_f32(s);
        if (writer) sum[base + i] = s;
      }
      ss = rms_row_square_add(ss, h);
    }
    const float r = rsqrtf(rms_row_block_sum(ss, part) * n.inv_c + n.eps);
    for (int i = static_cast<int>(threadIdx.x); i < in; i += kThreads) {
      float h = to_f32(x[base + i]);
      if (res) h = round_to<TX>(h + to_f32(res[base + i]));
      const float wf = n.mode == NormWeight::kNone ? 1.f : rms_row_weight(n.mode, to_f32(w[i]), n.offset);
      const float v = rms_row_normed<TX>(n.mode, h, r, wf);
      const int c = i / kCodes;
      xs[(m * chunks + c) * kStride + (i - c * kCodes)] = v;
      if (writer && normed) normed[base + i] = from_f32<TX>(v);
    }
    __syncthreads();  // `part` is reused by the next row
  }
}

// The dense kernel. U: chunks per tile (2, 4 or 8); it decides when loads are issued, not the order
// of the sums. With nd.on the block first stages the normed x (stage_normed_x) as fp32 in its padded
// chunk slots of dynamic shared memory; otherwise x is read per chunk from L1/L2.
template <typename TX, int MaxM, int U, bool Lora>
__global__ void __launch_bounds__(kThreads)
    gemv_kernel(const TX* __restrict__ x, const Segs segs, int M, int in, const NormDev nd) {
  constexpr int kCodes = codes_per_chunk<TX, 0>();
  constexpr int kStride = smem_chunk_stride<TX, 0>();
  // Dynamic shared memory: x as fp32 [M, chunks, kStride] with the norm. Static: the warps' partial
  // sums of rows over several warps.
  extern __shared__ float gemv_smem[];
  __shared__ float gemv_part[MaxM][kWarps];
  pdl_launch_dependents();  // the next kernel may launch and start its own weight loads
  const unsigned bid = blockIdx.x;
  const SegView<TX> sg = segment_of<TX>(segs, bid);
  const int si = sg.si;
  const unsigned first = sg.first;
  const uint4* __restrict__ wv = sg.w;
  const int64_t out = sg.out;

  // Lanes per row: 4..256, the same for every block of a segment (so block-uniform). A row of
  // more than 32 lanes is tpr/32 consecutive whole warps; one of at most 32 is an aligned lane group.
  const int tpr_log2 = sg.log2;
  const int tpr = 1 << tpr_log2;
  const int t = static_cast<int>(threadIdx.x) & (tpr - 1);
  const int64_t row = static_cast<int64_t>(bid - first) * (kThreads >> tpr_log2) + (static_cast<int>(threadIdx.x) >> tpr_log2);
  const bool live = row < out;
  const int chunks = in / kCodes;  // 16-byte chunks per row
  const uint4* __restrict__ wrow = wv + (live ? row : 0) * chunks;

  // A lane's tile: U chunks of its row from chunk c0 on, c0 + u·tpr (zeros past the row, not
  // read). The chunk loads are ordered.
  uint4 w[U];
  auto load_tile = [&](int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * tpr;
      w[u] = ld16_ordered(wrow + c, live && c < chunks);
    }
  };
  // The first tile's loads go out before pdl_wait and before x is staged, so neither the previous
  // kernel's tail nor the barrier delays the weight stream (most layer matrices need one tile per
  // lane).
  if (t < chunks) load_tile(t);
  // The LoRA term's operands (GemvSegment::lora_*): lanes t < lg of a row take j = t, t + lg, … of
  // its rank; the first share is loaded here (B, a weight, before pdl_wait; h, an earlier kernel's
  // output, after it), plain loads that ptxas may move towards their use. (An L1 prefetch here
  // instead, to hold no registers, made the 1B step's LoRA launches slower: H200, 2026-12-04,
  // 48 base launches 498 → 756 µs a step.)
  // Lora: the instance launched when a segment has a LoRA term (M = 1; a separate instance so the
  // plain ones carry none of it).
  const int lrank = Lora ? pick(si, segs.lora_rank[0], segs.lora_rank[1], segs.lora_rank[2]) : 0;  // block-uniform
  const int lg = tpr < 32 ? tpr : 32;
  const bool lown = Lora && lrank > 0 && live && t < lg && t < lrank;
  float lb = 0.f;
  if (lown) lb = to_f32(static_cast<const TX*>(pick(si, segs.lora_b[0], segs.lora_b[1], segs.lora_b[2]))[row * lrank + t]);
  pdl_wait();  // x (and y's buffer) belong to earlier kernels: only weights were read above
  float lh[MaxM];
#pragma unroll
  for (int m = 0; m < MaxM; ++m) lh[m] = 0.f;
  if (lown) {
    const TX* __restrict__ hv = static_cast<const TX*>(pick(si, segs.lora_h[0], segs.lora_h[1], segs.lora_h[2]));
#pragma unroll
    for (int m = 0; m < MaxM; ++m)
      if (m < M) lh[m] = to_f32(hv[m * lrank + t]);
  }
  float* const xs_smem = gemv_smem;
  if (nd.on) {
    stage_normed_x<TX, 0>(x, nd, M, in, xs_smem);
    __syncthreads();
  }

  float acc[MaxM];
#pragma unroll
  for (int m = 0; m < MaxM; ++m) acc[m] = 0.f;

  for (int c0 = t; c0 < chunks; c0 += tpr * U) {
    if (c0 != t) load_tile(c0);
    if (nd.on) {  // the normed x of the prologue (GemvNorm), as fp32 in its padded chunk slots
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * tpr;
#pragma unroll
        for (int m = 0; m < MaxM; ++m) {
          const bool ok = c < chunks && m < M;
          const float4* p = reinterpret_cast<const float4*>(xs_smem + ((ok ? m : 0) * chunks + (ok ? c : 0)) * kStride);
          float xf[kCodes];
#pragma unroll
          for (int q = 0; q < kCodes / 4; ++q) {
            const float4 v = p[q];
            xf[4 * q] = v.x, xf[4 * q + 1] = v.y, xf[4 * q + 2] = v.z, xf[4 * q + 3] = v.w;
          }
          const float d = chunk_dot<TX>(w[u], xf);
          acc[m] = ok ? acc[m] + d : acc[m];
        }
      }
      continue;
    }
    // x from global memory: no branch inside a tile, so its x loads can go out back to back. A chunk past the
    // row or a row of x past M loads nothing and adds nothing (a select, not a + 0: the sums
    // are those of the branchy form, whatever U is).
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * tpr;
#pragma unroll
      for (int m = 0; m < MaxM; ++m) {
        const bool ok = c < chunks && m < M;
        const uint4 xv = ld16_ordered(x + static_cast<int64_t>(m) * in + static_cast<int64_t>(c) * kCodes, ok);
        const TX* e = reinterpret_cast<const TX*>(&xv);
        float xf[kCodes];
#pragma unroll
        for (int k = 0; k < kCodes; ++k) xf[k] = to_f32(e[k]);
        const float d = chunk_dot<TX>(w[u], xf);
        acc[m] = ok ? acc[m] + d : acc[m];
      }
    }
  }

  // Reduce over the row's lanes: xor shuffles inside each warp (offsets below min(tpr, 32) stay in
  // the row's aligned lane group), then for rows over several warps lane 0 of each warp leaves its
  // sum in shared memory and the row's first lane adds them in warp order.
  const int group = tpr < 32 ? tpr : 32;
#pragma unroll
  for (int m = 0; m < MaxM; ++m)
    for (int o = group >> 1; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
  if (tpr > 32) {  // block-uniform, so every thread reaches the barrier
    const int warp = static_cast<int>(threadIdx.x) >> 5;
    if ((threadIdx.x & 31u) == 0) {
#pragma unroll
      for (int m = 0; m < MaxM; ++m)
        if (m < M) gemv_part[m][warp] = acc[m];
    }
    __syncthreads();
    if (t == 0) {  // lane 0 of the row's first warp
#pragma unroll
      for (int m = 0; m < MaxM; ++m) {
        if (m < M) {
          float v = gemv_part[m][warp];
          for (int k = 1; k < (tpr >> 5); ++k) v += gemv_part[m][warp + k];
          acc[m] = v;
        }
      }
    }
  }
  if (Lora && lrank > 0) {  // block-uniform: every lane takes part in the shuffles
    // Σ_j B[row, j] · h[m, j] over the row's first lg lanes (fixed order for a given rank and lane
    // count), then scaled onto the complete base sum: one rounding for both, as addmm's.
    float lp[MaxM];
#pragma unroll
    for (int m = 0; m < MaxM; ++m) lp[m] = lb * lh[m];
    if (lown && t + lg < lrank) {
      const TX* __restrict__ bv2 = static_cast<const TX*>(pick(si, segs.lora_b[0], segs.lora_b[1], segs.lora_b[2])) + row * lrank;
      const TX* __restrict__ hv = static_cast<const TX*>(pick(si, segs.lora_h[0], segs.lora_h[1], segs.lora_h[2]));
      for (int j = t + lg; j < lrank; j += lg) {
        const float b = to_f32(bv2[j]);
#pragma unroll
        for (int m = 0; m < MaxM; ++m)
          if (m < M) lp[m] = fmaf(b, to_f32(hv[m * lrank + j]), lp[m]);
      }
    }
#pragma unroll
    for (int m = 0; m < MaxM; ++m)
      for (int o = lg >> 1; o > 0; o >>= 1) lp[m] += __shfl_xor_sync(0xffffffffu, lp[m], o);
    const float ls = pick(si, segs.lora_scale[0], segs.lora_scale[1], segs.lora_scale[2]);
#pragma unroll
    for (int m = 0; m < MaxM; ++m) acc[m] = fmaf(ls, lp[m], acc[m]);
  }
  if (t == 0 && live) {
    // y is picked here, not with the other pointers (live across the loop it cost a 12-byte spill
    // in an earlier, affine form of this kernel: ptxas -v).
    TX* __restrict__ y = static_cast<TX*>(pick(si, segs.y[0], segs.y[1], segs.y[2]));
#pragma unroll
    for (int m = 0; m < MaxM; ++m)
      if (m < M) y[static_cast<int64_t>(m) * out + row] = from_f32<TX>(acc[m]);
  }
}

int log2_exact(int64_t v) {
  int s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return (int64_t{1} << s) == v ? s : -1;
}

// Fills the segment table from `a` (weights, scales, biases, outputs, LoRA terms), each segment's
// tpr_log2 from log2_of(segment) and its blocks from rows_per_block(tpr_log2); unused segments end
// at UINT32_MAX. Returns the grid's block count, or -1 past 2^31 − 1 blocks.
template <typename Log2Of, typename RowsPerBlock>
int64_t fill_segs(const GemvArgs& a, Segs& segs, Log2Of log2_of, RowsPerBlock rows_per_block) {
  int64_t end = 0;
  for (int s = 0; s < 3; ++s) {
    if (s < a.n_seg) {
      const GemvSegment& g = a.seg[s];
      segs.w[s] = g.w;
      segs.s[s] = g.scales;
      segs.b[s] = g.biases;
      segs.y[s] = g.y;
      segs.out[s] = g.out;
      segs.lora_b[s] = g.lora_b;
      segs.lora_h[s] = g.lora_h;
      segs.lora_rank[s] = g.lora_rank;
      segs.lora_scale[s] = g.lora_scale;
      segs.tpr_log2[s] = log2_of(g);
      const int64_t per = rows_per_block(segs.tpr_log2[s]);
      end += (g.out + per - 1) / per;
      if (end > 0x7fffffff) return -1;
      segs.block_end[s] = static_cast<unsigned>(end);
    } else {
      segs.block_end[s] = 0xffffffffu;
      segs.tpr_log2[s] = 2;
    }
  }
  return end;
}

}  // namespace
}  // namespace hearth::kernels

#include "gemv_affine.cuh"  // affine launches (uses Segs, NormDev, stage_normed_x, log2_exact, fill_segs)

namespace hearth::kernels {
namespace {

int chunk_codes(const GemvArgs& a) {
  if (a.format != WeightFormat::kDense) return 128 / static_cast<int>(a.format);
  return a.x_dtype == QDtype::kFloat32 ? 4 : 8;
}

// Lanes per row (log2) of a launch with the norm in its prologue (GemvNorm): at most one warp.
constexpr int kNormedMaxLanesLog2 = 5;

// Dynamic shared memory a launch may use: the default 48 KB less the kernel's static arrays (the
// dense kernel's partial sums of multi-warp rows, up to MaxM·8 floats, the affine kernel's of its
// row groups, and stage_normed_x's 8 floats).
constexpr int64_t kSmemBudget = 48 * 1024 - 512;
constexpr int64_t kAffineSmemBudget = 48 * 1024 - kAffineStaticSmem;

// Bytes of dynamic shared memory a launch with the norm in its prologue stages x in (fp32 in padded
// chunk slots, smem_chunk_stride), or -1 where that exceeds its kernel's budget. Host side; the same
// for gemv_supported and the launches.
int64_t normed_x_bytes(const GemvArgs& a) {
  const int64_t codes = chunk_codes(a), chunks = a.in / codes;
  const int64_t bytes = a.M * chunks * (codes + 4) * int64_t{4};
  const int64_t budget = a.format == WeightFormat::kDense ? kSmemBudget : kAffineSmemBudget;
  return bytes <= budget ? bytes : -1;
}

// tile: chunks per tile (2, 4 or 8).
template <typename TX, int MaxM, bool Lora>
const char* launch_m(const GemvArgs& a, const Segs& segs, unsigned blocks, int tile) {
  static_assert(smem_chunk_stride<TX, 0>() == codes_per_chunk<TX, 0>() + 4, "normed_x_bytes's chunk stride");
  static_assert(int64_t{MaxM} * kWarps * 4 + kThreads / 32 * 4 <= 48 * 1024 - kSmemBudget, "static shared memory");
  const GemvNorm& g = a.norm;
  const NormDev nd{g.residual, g.sum, g.normed, g.weight, g.mode, g.offset, g.eps,
                   1.f / static_cast<float>(a.in), g.on ? 1 : 0};
  auto kernel = gemv_kernel<TX, MaxM, kUnroll, Lora>;
  if (tile <= 2) kernel = gemv_kernel<TX, MaxM, 2, Lora>;
  else if (tile <= 4) kernel = gemv_kernel<TX, MaxM, 4, Lora>;
  const size_t smem = g.on ? static_cast<size_t>(normed_x_bytes(a)) : 0;
  const cudaError_t e = launch_kernel(kernel, dim3(blocks), dim3(kThreads), smem, static_cast<cudaStream_t>(a.stream),
                                      static_cast<const TX*>(a.x), segs, static_cast<int>(a.M), static_cast<int>(a.in), nd);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

// Lanes per row (log2, 2..8) of one segment: first the power of two in 4..32 that gives a lane
// about kUnroll chunks (one tile); then a row longer than 32 lanes' tiles widens, up to 256 lanes
// (8 warps), until a lane has at most kDenseChunksPerLane chunks. A function of `in` alone, so a
// grouped launch gives each segment the bits of its separate launch.
// bf16 (fp32 rows have twice the chunks): in 2048 → 32 lanes (8 chunks each: 1B q/k/v, o, gate/up,
// lm_head), 4096 → 128 (4: the 8B's), 8192 → 256 (4: 1B down), 14336 → 256 (7: 8B down).
template <typename TX>
int lanes_log2(int64_t in) {
  const int64_t chunks = in / codes_per_chunk<TX, 0>();
  int l = 2;
  while (l < 5 && (int64_t{2} << l) * kUnroll <= chunks) ++l;  // ~kUnroll chunks a lane, up to a warp
  if (chunks > (int64_t{1} << l) * kUnroll)  // more than one warp's tile: spread over warps
    while (l < kMaxLanesLog2 && (int64_t{1} << l) * kDenseChunksPerLane < chunks) ++l;
  return l;
}

// Fills the segment table (each segment's lanes per row, its rows in whole blocks), picks the tile
// (the fewest of 2, 4, 8 chunks that covers a lane's share of a row: one round trip per lane where
// a row allows, and no registers held for chunks a lane does not have), launches.
template <typename TX>
const char* launch_dense(const GemvArgs& a) {
  bool lora = false;
  for (int s = 0; s < a.n_seg; ++s) lora = lora || a.seg[s].lora_rank > 0;
  Segs segs{};
  const int64_t chunks = a.in / codes_per_chunk<TX, 0>();
  const int64_t end = fill_segs(
      a, segs,
      [&](const GemvSegment&) {
        // A normed launch computes the norm once per block: one warp per row (8 rows a block) keeps
        // that to out/8 blocks (H200, 1B bf16: gate/up with 2 rows a block, 8,192 blocks, took 69 µs
        // with the norm against ~17 without).
        const int l = lanes_log2<TX>(a.in);
        return a.norm.on && l > kNormedMaxLanesLog2 ? kNormedMaxLanesLog2 : l;
      },
      [](int l) { return int64_t{kThreads >> l}; });
  if (end < 0) return "gemv: too many output rows for one grid";
  int64_t per_lane = 1;
  for (int s = 0; s < a.n_seg; ++s) {
    const int64_t lanes = int64_t{1} << segs.tpr_log2[s];
    if ((chunks + lanes - 1) / lanes > per_lane) per_lane = (chunks + lanes - 1) / lanes;
  }
  const unsigned blocks = static_cast<unsigned>(end);
  const int tile = per_lane <= 2 ? 2 : per_lane <= 4 ? 4 : kUnroll;
  const int M = static_cast<int>(a.M);
  if (lora) return launch_m<TX, 1, true>(a, segs, blocks, tile);  // M = 1 (gemv_supported)
  if (M <= 1) return launch_m<TX, 1, false>(a, segs, blocks, tile);
  if (M <= 2) return launch_m<TX, 2, false>(a, segs, blocks, tile);
  if (M <= 4) return launch_m<TX, 4, false>(a, segs, blocks, tile);
  return launch_m<TX, 8, false>(a, segs, blocks, tile);
}

template <typename TX>
const char* launch_format(const GemvArgs& a) {
  switch (a.format) {
    case WeightFormat::kDense: return launch_dense<TX>(a);
    case WeightFormat::kAffine4:
      return a.s_dtype == QDtype::kFloat32 ? launch_affine<TX, float, 4>(a) : launch_affine<TX, TX, 4>(a);
    case WeightFormat::kAffine8:
      return a.s_dtype == QDtype::kFloat32 ? launch_affine<TX, float, 8>(a) : launch_affine<TX, TX, 8>(a);
  }
  return "gemv: unknown weight format";
}

}  // namespace

bool gemv_supported(const GemvArgs& a) {
  if (a.M < 1 || a.M > 8 || a.n_seg < 1 || a.n_seg > 3 || a.in <= 0 || a.in > 0x7fffffff) return false;
  for (int s = 0; s < a.n_seg; ++s) {
    const GemvSegment& g = a.seg[s];
    if (g.out < 1) return false;
    if (g.lora_rank != 0 &&
        (a.M != 1 || g.lora_rank < 1 || g.lora_rank > kGemvMaxLoraRank || !g.lora_b || !g.lora_h))
      return false;
  }
  if (a.in % chunk_codes(a) != 0) return false;
  if (a.norm.on) {
    const GemvNorm& n = a.norm;
    if ((!n.weight && n.mode != NormWeight::kNone) || (n.residual && !n.sum) || normed_x_bytes(a) < 0) return false;
  }
  if (a.format == WeightFormat::kDense) return true;
  if (a.format != WeightFormat::kAffine4 && a.format != WeightFormat::kAffine8) return false;
  return (a.group_size == 32 || a.group_size == 64 || a.group_size == 128) && a.in % a.group_size == 0 &&
         (a.s_dtype == a.x_dtype || a.s_dtype == QDtype::kFloat32);
}

const char* gemv(const GemvArgs& a) {
  if (!gemv_supported(a)) return "gemv: unsupported M/in/format/group_size/dtypes";
  if (!aligned16(a.x)) return "gemv: x must be 16-byte aligned";
  for (int s = 0; s < a.n_seg; ++s)
    if (!aligned16(a.seg[s].w)) return "gemv: weights must be 16-byte aligned";
  switch (a.x_dtype) {
    case QDtype::kFloat32: return launch_format<float>(a);
    case QDtype::kFloat16: return launch_format<__half>(a);
    case QDtype::kBFloat16: return launch_format<__nv_bfloat16>(a);
  }
  return "gemv: unknown x dtype";
}

}  // namespace hearth::kernels
