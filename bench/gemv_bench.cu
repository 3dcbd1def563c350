// Decode GEMV micro-benchmark (issue 11): Hearth's kernels/gemv.cu on the 1B shape's projections,
// M = 1, timed inside a CUDA graph over enough distinct weight copies that nothing stays in L2.
// Prints µs per launch and TB/s per shape, and a 16-layer chain (q/k/v, o, gate/up, down, each
// layer its own weights) as a replayed decode step runs it. HEARTH_PDL=0/1 picks plain or
// programmatic dependent launches (kernels/pdl.cuh). Not a test: numbers go in docs/benchmarks.md.
//   nvcc -std=c++17 -O3 -arch=sm_90 -cudart static -I src/kernels bench/gemv_bench.cu -o /tmp/gemv_bench
//   HEARTH_PDL=1 /tmp/gemv_bench [reps] [bulk]
// (gemv.cu is #included below: do not also list it on the nvcc line, or gemv() is defined twice.)
// After the production kernel it times the candidate layouts of dense bf16 at M = 1 (split-K inside
// a block, deeper per-lane loads, rows per warp sharing x, and with the argument `bulk` the bulk-copy staging, which is left
// out by default because a wrong transaction count would hang it): per candidate and shape, µs per
// launch, TB/s, and max |y - y_production| / max |y_production| on the same x and weights (one
// bf16 rounding of the largest output is ~0.004; 0 means bit-identical; 1e+30 a NaN or an output
// the candidate never wrote).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../src/kernels/gemv.cu"
#include "cuda_bench_util.cuh"

namespace {
using hearth::kernels::GemvArgs;
using hearth::kernels::QDtype;

using hearth::bench::check;
using hearth::bench::random_bf16;
using hearth::bench::time_graph;

struct Shape {
  const char* name;
  int64_t in;
  std::vector<int64_t> outs;  // segments sharing x
};

// One weight set of a shape: its segments' matrices and outputs.
struct Weights {
  std::vector<__nv_bfloat16*> w, y;
};

Weights make(const Shape& s, uint32_t seed) {
  Weights r;
  for (int64_t o : s.outs) {
    r.w.push_back(random_bf16(static_cast<size_t>(o * s.in), seed++));
    r.y.push_back(random_bf16(static_cast<size_t>(o), seed++));
  }
  return r;
}

void launch(const Shape& s, const Weights& w, const __nv_bfloat16* x, cudaStream_t st) {
  GemvArgs a;
  a.x = x;
  a.x_dtype = QDtype::kBFloat16;
  a.M = 1;
  a.in = s.in;
  a.n_seg = static_cast<int>(s.outs.size());
  for (int i = 0; i < a.n_seg; ++i) a.seg[i] = {w.w[i], nullptr, nullptr, w.y[i], s.outs[i]};
  a.stream = st;
  if (const char* e = hearth::kernels::gemv(a)) {
    std::fprintf(stderr, "gemv: %s\n", e);
    std::exit(1);
  }
}

// A candidate layout for dense bf16, M = 1: a block owns 256·U consecutive 16-byte chunks of W
// (whole rows: chunks per row a multiple of 256 dividing 256·U), each thread loads its U chunks
// before using any, then one block reduction per row in a fixed order.
template <int U>
__global__ void __launch_bounds__(256) gemv_v2(const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ W,
                                               __nv_bfloat16* __restrict__ y, int64_t out, int chunks) {
  hearth::kernels::pdl_launch_dependents();
  const int t = threadIdx.x, rows_pb = 256 * U / chunks;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * rows_pb;
  uint4 w[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int f = u * 256 + t, r = f / chunks, c = f - r * chunks;
    w[u] = row0 + r < out ? __ldg(W + (row0 + r) * chunks + c) : make_uint4(0, 0, 0, 0);
  }
  hearth::kernels::pdl_wait();
  float part[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = (u * 256 + t) % chunks;
    float xf[8];
    hearth::kernels::load_x<__nv_bfloat16, 8>(x + c * 8, xf);
    part[u] = hearth::kernels::chunk_dot<__nv_bfloat16>(w[u], xf);
  }
  __shared__ float red[U][8];
  const int per_row = chunks / 256;  // u's per row
#pragma unroll
  for (int r = 0; r < U; ++r) {
    if (r >= rows_pb) break;
    float v = 0.f;
    for (int k = 0; k < per_row; ++k) v += part[r * per_row + k];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((t & 31) == 0) red[r][t >> 5] = v;
  }
  __syncthreads();
  if (t < rows_pb && row0 + t < out) {
    float v = 0.f;
    for (int k = 0; k < 8; ++k) v += red[t][k];
    y[row0 + t] = __float2bfloat16(v);
  }
}

template <int U>
void launch_v2(int64_t in, int64_t out, const __nv_bfloat16* w, __nv_bfloat16* y, const __nv_bfloat16* x,
               cudaStream_t st) {
  const int chunks = static_cast<int>(in / 8), rows_pb = 256 * U / chunks;
  check(hearth::kernels::launch_kernel(gemv_v2<U>, dim3(static_cast<unsigned>((out + rows_pb - 1) / rows_pb)), dim3(256), 0,
                                       st, x, reinterpret_cast<const uint4*>(w), y, out, chunks),
        "gemv_v2");
}

// ---- Candidate layouts for dense bf16, M = 1 (bench only; each checked against gemv() in main) ----
// All take up to three matrices sharing x, like gemv(): block b belongs to the segment whose
// block_end first exceeds b, and each segment's rows fill whole blocks. All launch with
// launch_kernel (PDL as the production kernel: weights only before pdl_wait, x and y after).
using bf16 = __nv_bfloat16;
using hearth::kernels::pick;
using hearth::kernels::pdl_launch_dependents;
using hearth::kernels::pdl_wait;

// Loads of the candidates: gemv()'s own ordered load (kernels/gemv_chunk.cuh ld16_ordered: coherent
// ld.global in an asm volatile with a memory clobber, so neither nvcc nor ptxas moves them past each
// other or past griddepcontrol.wait). Why: compiled here (CUDA 13, sm_90, ptxas -v; no SASS dump on
// this machine), a lane that __ldg's 32 chunks before any use came out at 38 registers, as did 16 or
// 8 chunks, and gemv_v2<16> above at 34 (16 chunks need 64 registers just to be held): ptxas sinks
// ld.global.nc loads down to their use, so "all loads before any use" in the source is not what
// runs. With these loads the register counts follow the source (deep U=32 below: 166; U=8 D=0: 58;
// U=16 D=0: 90). gemv() used __ldg then (56 registers for 8 chunks); cand deep U=8 D=0 against it
// measured the difference (qkv 5.07 -> 4.08 µs, down 16.27 -> 13.61), and gemv() now loads its
// weight chunks (and x) the same way, with rows split over up to 8 warps as cand_splitk: its
// `production` lines time that.
__device__ __forceinline__ uint4 ld_ordered(const void* p) { return hearth::kernels::ld16_ordered(p); }

// 8 bf16 of x (16-byte aligned) to fp32 with one ordered load; after pdl_wait only.
__device__ __forceinline__ void cand_load_x(const bf16* p, float* xf) {
  const uint4 v = ld_ordered(p);
  const bf16* e = reinterpret_cast<const bf16*>(&v);
#pragma unroll
  for (int k = 0; k < 8; ++k) xf[k] = __bfloat162float(e[k]);
}

struct CandSegs {
  const uint4* w[3];
  bf16* y[3];
  int64_t out[3];
  unsigned block_end[3];  // unused segments: UINT32_MAX
};

// The segment table of a weight set when each block takes rows_per_block rows; *blocks gets the grid.
CandSegs cand_segs(const Shape& s, const Weights& w, int64_t rows_per_block, unsigned* blocks) {
  CandSegs r{};
  int64_t end = 0;
  for (int i = 0; i < 3; ++i) {
    if (i < static_cast<int>(s.outs.size())) {
      r.w[i] = reinterpret_cast<const uint4*>(w.w[i]);
      r.y[i] = w.y[i];
      r.out[i] = s.outs[i];
      end += (s.outs[i] + rows_per_block - 1) / rows_per_block;
      r.block_end[i] = static_cast<unsigned>(end);
    } else {
      r.block_end[i] = 0xffffffffu;
    }
  }
  *blocks = static_cast<unsigned>(end);
  return r;
}

// Which segment block `bid` belongs to, and the block index of its first block.
__device__ __forceinline__ int cand_seg(const CandSegs& g, unsigned bid, unsigned* first) {
  const int si = (bid >= g.block_end[0]) + (bid >= g.block_end[1]);
  *first = pick(si, 0u, g.block_end[0], g.block_end[1]);
  return si;
}

// Candidate 1, split-K inside a block: a row's chunks are cut into S slices of 32·U consecutive
// chunks (chunks = S·32·U exactly), one warp per (row, slice), so a block of 8 warps holds 8/S
// rows. Every lane loads its U chunks of the slice before using any (one round trip per warp; the
// production layout walks an 8192-wide row in 4 tiles of 8 one after another), and the grid has S
// times the production kernel's warps (down at S = 4: 1,024 blocks of a quarter row per warp).
// The S partials of a row meet in shared memory and one thread adds them in slice order and
// rounds once, so the result is deterministic (its order differs from gemv(), whose lanes take
// chunks t + lanes·j across the whole row: expect ~1 bf16 ulp, not 0). The brief's cross-block split with an fp32 workspace would add a second launch or an
// atomic counter for the same warp-level work; keeping a row's slices in one block needs neither.
template <int S, int U>
__global__ void __launch_bounds__(256) cand_splitk(const bf16* __restrict__ x, const CandSegs segs) {
  static_assert(S == 1 || S == 2 || S == 4 || S == 8, "S divides the block's 8 warps");
  constexpr int kChunks = S * 32 * U;
  pdl_launch_dependents();
  unsigned first;
  const int si = cand_seg(segs, blockIdx.x, &first);
  const uint4* __restrict__ W = pick(si, segs.w[0], segs.w[1], segs.w[2]);
  bf16* __restrict__ y = pick(si, segs.y[0], segs.y[1], segs.y[2]);
  const int64_t out = pick(si, segs.out[0], segs.out[1], segs.out[2]);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int slice = warp % S;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x - first) * (8 / S);
  const int64_t row = row0 + warp / S;
  const bool live = row < out;
  const int c0 = slice * 32 * U + lane;  // the lane's chunks: c0 + 32·u
  const uint4* __restrict__ wrow = W + (live ? row : 0) * kChunks + c0;
  uint4 w[U];
#pragma unroll
  for (int u = 0; u < U; ++u) w[u] = ld_ordered(wrow + 32 * u);  // a dead row reads row 0 and writes nothing
  pdl_wait();
  float acc = 0.f;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float xf[8];
    cand_load_x(x + (c0 + 32 * u) * 8, xf);
    acc += hearth::kernels::chunk_dot<bf16>(w[u], xf);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  __shared__ float part[8];  // [row in block][slice]: warp = (row in block)·S + slice
  if (lane == 0) part[warp] = acc;
  __syncthreads();
  const int r = static_cast<int>(threadIdx.x);
  if (r < 8 / S && row0 + r < out) {
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < S; ++k) v += part[r * S + k];
    y[row0 + r] = __float2bfloat16_rn(v);
  }
}

template <int S, int U>
void launch_splitk(const Shape& s, const Weights& w, const bf16* x, cudaStream_t st) {
  if (s.in != int64_t{S} * 32 * U * 8) {
    std::fprintf(stderr, "splitk<%d,%d>: in %lld is not S*32*U*8\n", S, U, static_cast<long long>(s.in));
    std::exit(1);
  }
  unsigned blocks;
  const CandSegs g = cand_segs(s, w, 8 / S, &blocks);
  check(hearth::kernels::launch_kernel(cand_splitk<S, U>, dim3(blocks), dim3(256), 0, st, x, g), "cand_splitk");
}

// Candidate 2, deeper loads per lane on the layout gemv() had before its rows spanned several warps:
// one warp per row (8 rows per block), lane t owning chunks t + 32·j for j < N (N = 8 at
// in = 2048, 32 at 8192), loaded in tiles of U chunks with D further tiles in flight: the first D + 1
// tiles go out before pdl_wait, and each later tile is issued right after the tile D + 1 before it
// has been used. (U, D) = (8, 0) was gemv()'s kUnroll 8 layout; (16, 0) kUnroll 16 (down: 2 tiles
// instead of 4); (8, 1) and (4, 3) keep 2 or 4 tiles in flight with 16 chunks of registers; (32, 0)
// loads a whole 8192-wide row's share at once (128 registers of weights, so fewer warps per SM).
// The chunk order and the shuffles were gemv()'s (diff 0 against the __ldg kernel); against
// today's gemv(), which splits 2048- and 8192-wide rows over 4 and 8 warps, expect ~1 bf16 ulp.
// The loads are ld_ordered, so the tiles go out in the source's order; (8, 0) against the __ldg
// gemv() measured that difference (see ld_ordered).
template <int N, int U, int D>
__global__ void __launch_bounds__(256) cand_deep(const bf16* __restrict__ x, const CandSegs segs) {
  static_assert(N % U == 0, "whole tiles");
  constexpr int T = N / U;  // tiles per lane
  constexpr int kChunks = 32 * N;
  pdl_launch_dependents();
  unsigned first;
  const int si = cand_seg(segs, blockIdx.x, &first);
  const uint4* __restrict__ W = pick(si, segs.w[0], segs.w[1], segs.w[2]);
  bf16* __restrict__ y = pick(si, segs.y[0], segs.y[1], segs.y[2]);
  const int64_t out = pick(si, segs.out[0], segs.out[1], segs.out[2]);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x - first) * 8 + (static_cast<int>(threadIdx.x) >> 5);
  const bool live = row < out;
  const uint4* __restrict__ wrow = W + (live ? row : 0) * kChunks + lane;
  uint4 w[N];
  auto load_tile = [&](int k) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      w[k * U + u] = ld_ordered(wrow + 32 * (k * U + u));  // a dead row reads row 0, writes nothing
  };
#pragma unroll
  for (int k = 0; k <= D && k < T; ++k) load_tile(k);
  pdl_wait();
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < T; ++k) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = k * U + u;
      float xf[8];
      cand_load_x(x + (lane + 32 * j) * 8, xf);
      acc += hearth::kernels::chunk_dot<bf16>(w[j], xf);
    }
    if (k + D + 1 < T) load_tile(k + D + 1);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0 && live) y[row] = __float2bfloat16_rn(acc);
}

template <int N, int U, int D>
void launch_deep(const Shape& s, const Weights& w, const bf16* x, cudaStream_t st) {
  if (s.in != int64_t{N} * 32 * 8) {
    std::fprintf(stderr, "deep<%d,%d,%d>: in %lld is not N*32*8\n", N, U, D, static_cast<long long>(s.in));
    std::exit(1);
  }
  unsigned blocks;
  const CandSegs g = cand_segs(s, w, 8, &blocks);
  check(hearth::kernels::launch_kernel(cand_deep<N, U, D>, dim3(blocks), dim3(256), 0, st, x, g), "cand_deep");
}

// Candidate 3 (run with the argument `bulk`), weights staged by the copy engine: a block of R
// whole rows has one thread issue one cp.async.bulk (TMA, sm_90) per row into dynamic shared
// memory, completing on one mbarrier, before pdl_wait; the block then computes from shared memory
// with the v2 layout (thread t takes flat chunks t + 256·j of its R rows, J = R·chunks/256 of them)
// and one block reduction per row. Bytes in flight are bounded by shared memory (R rows: 32 or 64
// KB per block, up to 227 KB per SM) instead of by registers × warps, which is what limits the
// 2048-wide shapes' single round trip and down's four. Row r's partial of thread t adds its chunks in
// j order, then xor shuffles, then the 8 warps in order: deterministic, ~1 ulp from gemv().
// A transaction count that does not match the bytes copied would hang the block on the barrier,
// so main runs it only when asked.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int R, int PerRow>  // R rows per block, PerRow = chunks / 256 (1 at in = 2048, 4 at 8192)
__global__ void __launch_bounds__(256) cand_bulk(const bf16* __restrict__ x, const CandSegs segs) {
  constexpr int kChunks = 256 * PerRow;
  constexpr uint32_t kRowBytes = kChunks * 16;
  extern __shared__ uint4 wsm[];  // [R][kChunks]
  __shared__ alignas(8) uint64_t bar;
  __shared__ float red[R][8];
  pdl_launch_dependents();
  unsigned first;
  const int si = cand_seg(segs, blockIdx.x, &first);
  const uint4* __restrict__ W = pick(si, segs.w[0], segs.w[1], segs.w[2]);
  bf16* __restrict__ y = pick(si, segs.y[0], segs.y[1], segs.y[2]);
  const int64_t out = pick(si, segs.out[0], segs.out[1], segs.out[2]);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x - first) * R;
  const int live_rows = static_cast<int>(out - row0 < R ? out - row0 : R);  // >= 1: blocks cover rows
  const uint32_t bar_a = smem_u32(&bar);
  const int t = static_cast<int>(threadIdx.x);
  if (t == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar_a), "r"(1) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (t == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_a),
                 "r"(kRowBytes * static_cast<uint32_t>(live_rows))
                 : "memory");
    for (int r = 0; r < live_rows; ++r)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       smem_u32(wsm + r * kChunks)),
                   "l"(W + (row0 + r) * kChunks), "r"(kRowBytes), "r"(bar_a)
                   : "memory");
  }
  pdl_wait();
  // x first (it does not depend on the copies), then wait for phase 0 of the barrier.
  float xf[PerRow][8];
#pragma unroll
  for (int k = 0; k < PerRow; ++k) cand_load_x(x + (k * 256 + t) * 8, xf[k]);
  asm volatile(
      "{\n\t.reg .pred p;\n"
      "WAIT:\n\t"  // a label local to this { } scope, as CUTLASS's ClusterBarrier::wait
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra WAIT;\n\t}" ::"r"(bar_a),
      "r"(0)
      : "memory");
  const int warp = t >> 5, lane = t & 31;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < PerRow; ++k) v += hearth::kernels::chunk_dot<bf16>(wsm[r * kChunks + k * 256 + t], xf[k]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[r][warp] = v;
  }
  __syncthreads();
  if (t < live_rows) {
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) v += red[t][k];
    y[row0 + t] = __float2bfloat16_rn(v);
  }
}

template <int R, int PerRow>
void launch_bulk(const Shape& s, const Weights& w, const bf16* x, cudaStream_t st) {
  if (s.in != int64_t{PerRow} * 256 * 8) {
    std::fprintf(stderr, "bulk<%d,%d>: in %lld is not PerRow*256*8\n", R, PerRow, static_cast<long long>(s.in));
    std::exit(1);
  }
  const size_t smem = size_t{R} * PerRow * 256 * 16;
  static bool attr = false;  // set on the first (eager, checked) call, before any capture
  if (!attr) {
    check(cudaFuncSetAttribute(cand_bulk<R, PerRow>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
          "bulk smem attribute");
    attr = true;
  }
  unsigned blocks;
  const CandSegs g = cand_segs(s, w, R, &blocks);
  check(hearth::kernels::launch_kernel(cand_bulk<R, PerRow>, dim3(blocks), dim3(256), smem, st, x, g), "cand_bulk");
}

// One candidate configuration: a name, the row width it is built for, its launcher.
// Candidate 4, rows per warp (the MLX affine kernel's layout, kernels/gemv_affine.cuh, for dense
// bf16): a warp owns R rows and WK warps split their chunks; lane t of the group's warp k walks
// chunks k·32 + t + i·32·WK in tiles of U chunks per row (R·U loads before any use) and loads the
// 8 values of x of a chunk once for its R rows — x traffic 1/R of one row a warp. Partials: lanes
// by xor shuffles, then the group's warps in order (expect ~1 bf16 ulp against gemv(), not 0).
template <int R, int WK, int U>
__global__ void __launch_bounds__(256) cand_rows(const bf16* __restrict__ x, const CandSegs segs, int chunks) {
  constexpr int kGroups = 8 / WK, kStep = 32 * WK;
  __shared__ float part[8][R];
  pdl_launch_dependents();
  unsigned first;
  const int si = cand_seg(segs, blockIdx.x, &first);
  const uint4* __restrict__ W = pick(si, segs.w[0], segs.w[1], segs.w[2]);
  const int64_t out = pick(si, segs.out[0], segs.out[1], segs.out[2]);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int grp = warp / WK, kw = warp % WK;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x - first) * kGroups + grp) * R;
  uint4 w[U][R];
  auto load = [&](int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int c = c0 + u * kStep;
        const bool ok = c < chunks && row0 + r < out;
        w[u][r] = hearth::kernels::ld16_ordered(W + (ok ? (row0 + r) * chunks + c : 0), ok);
      }
  };
  const int cs = kw * 32 + lane;
  if (cs < chunks) load(cs);
  pdl_wait();
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int c0 = cs; c0 < chunks; c0 += kStep * U) {
    if (c0 != cs) load(c0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * kStep;
      if (c >= chunks) break;
      float xf[8];
      cand_load_x(x + static_cast<int64_t>(c) * 8, xf);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += hearth::kernels::chunk_dot<bf16>(w[u][r], xf);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  if constexpr (WK > 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) part[warp][r] = acc[r];
    __syncthreads();
    if (kw == 0 && lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float v = part[warp][r];
        for (int k = 1; k < WK; ++k) v += part[warp + k][r];
        acc[r] = v;
      }
  }
  if (kw == 0 && lane == 0) {
    bf16* __restrict__ y = pick(si, segs.y[0], segs.y[1], segs.y[2]);
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (row0 + r < out) y[row0 + r] = __float2bfloat16(acc[r]);
  }
}

template <int R, int WK, int U>
void launch_rows(const Shape& s, const Weights& w, const bf16* x, cudaStream_t st) {
  unsigned blocks;
  const CandSegs g = cand_segs(s, w, 8 / WK * R, &blocks);
  check(hearth::kernels::launch_kernel(cand_rows<R, WK, U>, dim3(blocks), dim3(256), 0, st, x, g, static_cast<int>(s.in / 8)),
        "cand_rows");
}

struct Cand {
  const char* name;
  int64_t in;
  bool bulk;  // only with the `bulk` argument
  void (*launch)(const Shape&, const Weights&, const bf16*, cudaStream_t);
};

const Cand kCands[] = {
    // rows per warp: R rows share each load of x, WK warps per row group, U chunks per row a tile
    {"rows R=2 WK=1 U=4", 2048, false, launch_rows<2, 1, 4>},
    {"rows R=4 WK=1 U=2", 2048, false, launch_rows<4, 1, 2>},
    {"rows R=4 WK=2 U=2", 2048, false, launch_rows<4, 2, 2>},
    {"rows R=2 WK=2 U=2", 2048, false, launch_rows<2, 2, 2>},
    {"rows R=2 WK=4 U=4", 8192, false, launch_rows<2, 4, 4>},
    {"rows R=4 WK=4 U=2", 8192, false, launch_rows<4, 4, 2>},
    {"rows R=4 WK=2 U=2", 8192, false, launch_rows<4, 2, 2>},
    {"rows R=2 WK=8 U=2", 8192, false, launch_rows<2, 8, 2>},
    // split-K in a block: S slices of 32·U chunks
    {"splitk S=2 U=4", 2048, false, launch_splitk<2, 4>},
    {"splitk S=4 U=2", 2048, false, launch_splitk<4, 2>},
    {"splitk S=8 U=1", 2048, false, launch_splitk<8, 1>},
    {"splitk S=2 U=16", 8192, false, launch_splitk<2, 16>},
    {"splitk S=4 U=8", 8192, false, launch_splitk<4, 8>},
    {"splitk S=8 U=4", 8192, false, launch_splitk<8, 4>},
    // deeper loads: N chunks per lane in tiles of U, D tiles ahead
    {"deep U=8 D=0 (old)", 2048, false, launch_deep<8, 8, 0>},
    {"deep U=4 D=1", 2048, false, launch_deep<8, 4, 1>},
    {"deep U=2 D=3", 2048, false, launch_deep<8, 2, 3>},
    {"deep U=8 D=0 (old)", 8192, false, launch_deep<32, 8, 0>},
    {"deep U=16 D=0", 8192, false, launch_deep<32, 16, 0>},
    {"deep U=8 D=1", 8192, false, launch_deep<32, 8, 1>},
    {"deep U=4 D=3", 8192, false, launch_deep<32, 4, 3>},
    {"deep U=8 D=2", 8192, false, launch_deep<32, 8, 2>},
    {"deep U=32 D=0", 8192, false, launch_deep<32, 32, 0>},
    // bulk copies: R rows per block (32 or 64 KB of shared memory)
    {"bulk R=8", 2048, true, launch_bulk<8, 1>},
    {"bulk R=16", 2048, true, launch_bulk<16, 1>},
    {"bulk R=2", 8192, true, launch_bulk<2, 4>},
    {"bulk R=4", 8192, true, launch_bulk<4, 4>},
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  cudaStream_t st;
  check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  const std::vector<Shape> shapes = {{"qkv 2048->2048+512+512", 2048, {2048, 512, 512}},
                                     {"o 2048->2048", 2048, {2048}},
                                     {"gate/up 2048->8192+8192", 2048, {8192, 8192}},
                                     {"down 8192->2048", 8192, {2048}},
                                     {"lm_head 2048->128256", 2048, {128256}}};
  const __nv_bfloat16* x8k = random_bf16(8192, 7);
  std::printf("PDL %s\n", hearth::kernels::pdl_enabled() ? "on" : "off");
  std::vector<std::vector<Weights>> sets(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    int64_t bytes = 0;
    for (int64_t o : s.outs) bytes += o * s.in * 2;
    const int copies = static_cast<int>(std::max<int64_t>(16, (int64_t{400} << 20) / bytes));
    for (int c = 0; c < copies; ++c) sets[i].push_back(make(s, 1000u * i + 10u * c));
    check(cudaDeviceSynchronize(), "fill");
    const float us = time_graph(st, reps, [&] {
      for (const Weights& w : sets[i]) launch(s, w, x8k, st);
    });
    const float per = us / copies;
    std::printf("%-26s %3d copies  %7.2f us/launch  %5.2f TB/s\n", s.name, copies, per, bytes / (per * 1e-6) / 1e12);
  }
  // The candidates of this file on every shape they are built for, checked against gemv() on the
  // first weight set (their outputs first set to NaN, so an output never written shows as 1e+30).
  const bool bulk = argc > 2 && std::strcmp(argv[2], "bulk") == 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    const Weights& w0 = sets[i][0];
    int64_t bytes = 0;
    for (int64_t o : s.outs) bytes += o * s.in * 2;
    launch(s, w0, x8k, st);
    check(cudaStreamSynchronize(st), "gemv reference");
    std::vector<std::vector<float>> ref;
    for (size_t k = 0; k < s.outs.size(); ++k) ref.push_back(hearth::bench::to_host_f32(w0.y[k], s.outs[k]));
    for (const Cand& c : kCands) {
      if (c.in != s.in || (c.bulk && !bulk)) continue;
      for (size_t k = 0; k < s.outs.size(); ++k) check(cudaMemsetAsync(w0.y[k], 0xff, s.outs[k] * 2, st), "memset");
      c.launch(s, w0, x8k, st);
      check(cudaStreamSynchronize(st), c.name);
      double diff = 0;
      for (size_t k = 0; k < s.outs.size(); ++k)
        diff = std::max(diff, hearth::bench::max_rel_diff(ref[k], hearth::bench::to_host_f32(w0.y[k], s.outs[k])));
      const float us = time_graph(st, reps, [&] {
        for (const Weights& w : sets[i]) c.launch(s, w, x8k, st);
      });
      const float per = us / sets[i].size();
      std::printf("%-22s %-26s %7.2f us/launch  %5.2f TB/s  diff %.2e\n", c.name, s.name, per, bytes / (per * 1e-6) / 1e12,
                  diff);
    }
  }
  // The candidate layout on the single-matrix shapes (gate/up: its first 8,192-row matrix).
  for (size_t i : {size_t{1}, size_t{2}, size_t{3}, size_t{4}}) {
    const Shape& s = shapes[i];
    const int64_t out = s.outs[0];
    for (int U : {8, 16}) {
      if (256 * U % (s.in / 8) != 0) continue;
      const float us = time_graph(st, reps, [&] {
        for (const Weights& w : sets[i])
          U == 8 ? launch_v2<8>(s.in, out, w.w[0], w.y[0], x8k, st) : launch_v2<16>(s.in, out, w.w[0], w.y[0], x8k, st);
      });
      const float per = us / sets[i].size();
      std::printf("v2 U=%-2d %-19s %7.2f us/launch  %5.2f TB/s\n", U, s.name, per, out * s.in * 2 / (per * 1e-6) / 1e12);
    }
  }
  // A decode step's GEMVs: 16 layers of q/k/v, o, gate/up, down (distinct weights), then the head.
  int64_t step_bytes = 0;
  const float us = time_graph(st, reps, [&] {
    step_bytes = 0;
    for (int l = 0; l < 16; ++l)
      for (size_t i = 0; i < 4; ++i) {
        launch(shapes[i], sets[i][l], x8k, st);
        for (int64_t o : shapes[i].outs) step_bytes += o * shapes[i].in * 2;
      }
    launch(shapes[4], sets[4][0], x8k, st);
    step_bytes += 128256 * 2048 * 2;
  });
  std::printf("16-layer step GEMVs + head: %8.1f us  %5.2f TB/s  (%.2f GB)\n", us, step_bytes / (us * 1e-6) / 1e12,
              step_bytes / 1e9);
  return 0;
}
