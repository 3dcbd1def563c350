// A 1B decode step rebuilt from Hearth's kernels alone (issue 11): per layer the fused norm (with
// the previous layer's residual add), q/k/v GEMV, RoPE + cache write, split-K attention, o GEMV,
// add + norm, gate/up GEMV, silu·up, down GEMV; then the final norm and the head GEMV — the kernels
// a replayed `hearth bench` step runs, without ATen, the caching allocator or the sampler. Timed as
// one CUDA graph (median of replays), PDL per HEARTH_PDL. If this is well under the real step's
// time, the difference is outside these kernels. Not a test; numbers go in docs/benchmarks.md.
// Then candidate split-K attention kernels (namespace cand), timed like the "attention only" lines
// and checked against the production kernel, at the capacity given and at 4,160 keys.
//   nvcc -std=c++17 -O3 -arch=sm_90 -cudart static -I src/kernels bench/decode_step_bench.cu \
//     src/kernels/{gemv,norm_act,rope_cache,decode_attention}.cu -o /tmp/step_bench
//   HEARTH_PDL=1 /tmp/step_bench [capacity=704] [position=575] [reps=50] [nocand]
// ("nocand": stop after the production kernels' lines, e.g. at a 32K capacity.)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_bench_util.cuh"
#include "decode_attention.h"
#include "gemv.h"
#include "norm_act.h"
#include "pdl.cuh"
#include "rope_cache.h"

namespace {
using bf16 = __nv_bfloat16;
using namespace hearth::kernels;

using hearth::bench::check;
using hearth::bench::time_graph;

bf16* buf(size_t n, uint32_t seed, float scale = 0.05f) { return hearth::bench::random_bf16(n, seed, scale); }

constexpr int64_t C = 2048, H = 32, Hkv = 8, D = 64, I = 8192, V = 128256, L = 16;

struct Layer {
  bf16 *in_norm, *post_norm, *wq, *wk, *wv, *wo, *wg, *wu, *wd, *kc, *vc;
};

struct Acts {  // one set, reused by every layer (as a replayed step's buffers are)
  bf16 *sum, *sum2, *normed, *q, *k, *v, *qr, *attn, *o, *g, *u, *act, *delta, *logits, *cos, *sin, *mask;
  float* ws;
  int64_t* pos;
};

GemvArgs gemv_args(const bf16* x, int64_t in, std::vector<std::pair<const bf16*, bf16*>> segs, std::vector<int64_t> outs,
                   cudaStream_t st) {
  GemvArgs a;
  a.x = x;
  a.x_dtype = QDtype::kBFloat16;
  a.M = 1;
  a.in = in;
  a.n_seg = static_cast<int>(segs.size());
  for (int i = 0; i < a.n_seg; ++i) a.seg[i] = {segs[i].first, nullptr, nullptr, segs[i].second, outs[i]};
  a.stream = st;
  return a;
}

void norm(const bf16* x, const bf16* residual, bf16* sum, const bf16* w, bf16* y, cudaStream_t st) {
  RmsNormArgs a;
  a.x = x;
  a.residual = residual;
  a.sum = sum;
  a.weight = w;
  a.y = y;
  a.dtype = QDtype::kBFloat16;
  a.N = 1;
  a.C = C;
  a.eps = 1e-5f;
  a.stream = st;
  check(rms_norm(a), "rms_norm");
}

// The split plan of the step: decode_attention_plan's, or `splits` splits (rounded to whole tiles).
// The split kernel the step's attention runs (the production choice unless a line says otherwise).
DecodeAttentionKernel g_kernel = DecodeAttentionKernel::kAuto;

DecodeAttentionPlan attention_plan(int64_t S, int splits) {
  DecodeAttentionArgs shape;
  shape.B = 1, shape.H = H, shape.Hkv = Hkv, shape.T = 1, shape.S = S, shape.D = D;
  shape.k_ss = shape.v_ss = D, shape.o_sb = shape.o_st = H * D, shape.o_sh = D;
  shape.dtype = QDtype::kBFloat16;
  shape.kernel = g_kernel;
  const int tk = decode_attention_step_keys(shape);
  if (splits <= 0) return decode_attention_plan(Hkv, S, tk, 132, decode_attention_blocks_per_sm(shape));
  DecodeAttentionPlan p;
  p.keys_per_split = ((S + splits - 1) / splits + tk - 1) / tk * tk;
  p.n_split = static_cast<int>((S + p.keys_per_split - 1) / p.keys_per_split);
  return p;
}

// One step: `attn` false leaves out RoPE/cache/attention (o reads q's first C values); `splits` > 0
// overrides the attention's split count.
void step(const std::vector<Layer>& layers, const Acts& t, const bf16* final_norm, const bf16* head, int64_t S,
          bool attn, cudaStream_t st, int splits = 0, bool attention_only = false) {
  const DecodeAttentionPlan plan = attention_plan(S, splits);
  for (int64_t l = 0; l < L; ++l) {
    const Layer& w = layers[l];
    // Input norm: layer 0 reads the embedding (t.sum); later ones add the previous layer's delta.
    if (!attention_only) {
      if (l == 0) norm(t.sum, nullptr, nullptr, w.in_norm, t.normed, st);
      else norm(t.delta, t.sum2, t.sum, w.in_norm, t.normed, st);
      check(gemv(gemv_args(t.normed, C, {{w.wq, t.q}, {w.wk, t.k}, {w.wv, t.v}}, {H * D, Hkv * D, Hkv * D}, st)), "qkv");
    }
    const bf16* o_in = t.q;
    if (attn) {
      RopeCacheArgs r;
      r.q = t.q, r.k = t.k, r.v = t.v;
      r.q_sb = H * D, r.q_sh = D, r.k_sb = Hkv * D, r.k_sh = D, r.v_sb = Hkv * D, r.v_sh = D;
      r.cos = t.cos, r.sin = t.sin, r.positions = t.pos;
      r.q_out = t.qr, r.qo_sb = H * D, r.qo_sh = D;
      r.k_cache = w.kc, r.v_cache = w.vc, r.row_stride = S;
      r.B = 1, r.Hq = H, r.Hk = Hkv, r.D = D, r.rot = D;
      r.dtype = QDtype::kBFloat16;
      r.stream = st;
      if (!attention_only) check(rope_cache_write(r), "rope_cache_write");
      DecodeAttentionArgs a;
      a.q = t.qr, a.q_sb = H * D, a.q_sh = D, a.q_st = H * D;
      a.k = w.kc, a.k_sb = Hkv * S * D, a.k_sh = S * D, a.k_ss = D;
      a.v = w.vc, a.v_sb = Hkv * S * D, a.v_sh = S * D, a.v_ss = D;
      a.mask = t.mask, a.m_sb = 0, a.m_st = 0;
      a.out = t.attn, a.o_sb = H * D, a.o_sh = D, a.o_st = H * D;
      a.workspace = t.ws;
      a.B = 1, a.H = H, a.Hkv = Hkv, a.T = 1, a.S = S, a.D = D;
      a.scale = 0.125f;
      a.dtype = QDtype::kBFloat16;
      a.plan = plan;
      a.kernel = g_kernel;
      a.stream = st;
      check(decode_attention(a), "decode_attention");
      o_in = t.attn;
    }
    if (attention_only) continue;
    check(gemv(gemv_args(o_in, C, {{w.wo, t.o}}, {C}, st)), "o");
    norm(t.o, t.sum, t.sum2, w.post_norm, t.normed, st);  // residual + o, then the norm
    check(gemv(gemv_args(t.normed, C, {{w.wg, t.g}, {w.wu, t.u}}, {I, I}, st)), "gate/up");
    check(silu_mul(t.g, t.u, t.act, QDtype::kBFloat16, I, st), "silu_mul");
    check(gemv(gemv_args(t.act, I, {{w.wd, t.delta}}, {C}, st)), "down");
  }
  if (attention_only) return;
  norm(t.delta, t.sum2, t.sum, final_norm, t.normed, st);
  check(gemv(gemv_args(t.normed, C, {{head, t.logits}}, {V}, st)), "head");
}


// ---------------------------------------------------------------------------------------------
// Candidate decode-attention kernels (bench only, not Hearth's kernel): the 1B decode case alone,
// B = 1, T = 1, n_rep = 4 query rows per kv head, D = 64, bf16, an additive bf16 mask row (or none).
// The "regs ... + merge kernel" one has since become production for bf16/fp16 with ≤ 8 rows,
// generalised (kernels/decode_attention_regs.cuh); the "production" lines time that. Kept as the
// measured reference of the design (and of the fused last-block merge, not adopted).
//
// Why: the earlier tile kernel (decode_attention.cu, now fp32 and > 8 rows only) took ~4.5 µs per
// 64-key tile (16 KB) on the H200: a cp.async wait, three barriers, a mask round trip and a p·v loop
// on 32 of 128 threads per tile. These candidates drop the shared-memory staging and the barriers:
//   * warp-per-key-chunk, registers only. Block (split s, kv head g) of 4 warps walks its split in
//     chunks of 4·kIt·4 keys (64 for kIt = 4, 32 for kIt = 2); warp w takes kIt groups of 4
//     consecutive keys of a chunk; in a group, lane = 8·key + c: lane c of the key holds 16 bytes
//     (8 head-dim values) of the key's k row and of its v row, so one warp load reads 4 whole key
//     rows (512 contiguous bytes). All of a chunk's k, v and mask values are loaded at once, before
//     any arithmetic (one memory round trip per chunk, and the next chunk's loads are issued before
//     this chunk's arithmetic: register double buffering), the mask with the keys, not after.
//     Scores: each lane dots its 8 values with the 4 query rows (q in registers, loaded once) and
//     3 xor-shuffles (1, 2, 4) sum the 8 lanes of a key. Online softmax in registers (running max
//     per row shared by the warp through xor-shuffles 8 and 16; sum and accumulator kept per key
//     lane-group, rescaled by the same α, and summed over the 4 groups once at the end). One
//     __syncthreads for the block's merge of its 4 warps (in shared memory, fixed warp order).
//   * the splits' merge either as a second kernel (like production), or fused ("last block"): each
//     block writes its (max, sum, accumulator) to the workspace, __threadfence, atomicAdd on a
//     per-kv-head counter; the block that sees n_split − 1 merges all splits in split order 0..n−1
//     (deterministic, whichever block comes last) and resets the counter to 0 for the next launch
//     (the next launch only touches it after its pdl_wait, i.e. after this kernel completed). This
//     saves the merge kernel's launch and its ~3.5 µs per layer of the graph profile.
// −inf as production: keys past the split's end score −inf; a warp or split of only −inf keys has
// weight 0 in the merges (no exp(−inf − −inf)); a row with no weight writes 0, not NaN; a masked key
// (lowest bf16, finite) gets weight exactly 0 beside any unmasked key.
namespace cand {

constexpr int kR = 4, kD = 64, kThreads = 128, kWarps = 4, kMaxSplits = 128;

struct Args {
  const bf16* q = nullptr;     // [H, D] (B = 1, T = 1): row r of kv head g is head g·4 + r
  int64_t q_sh = 0;
  const bf16* k = nullptr;     // [Hkv, capacity, D]: kv_sh = capacity·D, key stride D
  const bf16* v = nullptr;
  int64_t kv_sh = 0;
  const bf16* mask = nullptr;  // [S] additive, or nullptr
  bf16* out = nullptr;         // [H, D], head stride o_sh
  int64_t o_sh = 0;
  float* ws = nullptr;         // Hkv·n_split·kR·(kD + 2) floats when n_split > 1
  int* counters = nullptr;     // Hkv ints, 0 between launches (fused merge only)
  int Hkv = 0, S = 0, n_split = 1, keys_per_split = 0;
  float scale = 1.f;
};

// 8 bf16 (16 bytes, element 0 in the low half of .x) → float32, exactly.
__device__ __forceinline__ void unpack8(const uint4& w, float* f) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

// Merge of the n_split partial results of kv head g (workspace → out), by one block of kThreads:
// thread (row r = tid / 32, columns d, d + 1 with d = 2·(tid % 32)); splits summed in order 0..n−1.
__device__ __forceinline__ void merge_splits(const Args& a, int g, int tid, float2* ml_s) {
  const int ns = a.n_split;
  const float2* ml = reinterpret_cast<const float2*>(a.ws + static_cast<int64_t>(a.Hkv) * ns * kR * kD) +
                     static_cast<int64_t>(g) * ns * kR;
  for (int i = tid; i < ns * kR; i += kThreads) ml_s[i] = __ldcg(ml + i);  // [s·kR + r] = (max, sum)
  __syncthreads();
  const int r = tid / 32, d = 2 * (tid % 32);
  float M = -INFINITY;
  for (int s = 0; s < ns; ++s) M = fmaxf(M, ml_s[s * kR + r].x);
  float den = 0.f, n0 = 0.f, n1 = 0.f;
  const float* o = a.ws + (static_cast<int64_t>(g) * ns * kR + r) * kD + d;  // split s adds s·kR·kD
#pragma unroll 4
  for (int s = 0; s < ns; ++s) {
    const float2 m_l = ml_s[s * kR + r];
    const float w = m_l.x == -INFINITY ? 0.f : expf(m_l.x - M);
    const float2 ov = __ldcg(reinterpret_cast<const float2*>(o + static_cast<int64_t>(s) * kR * kD));
    den = fmaf(w, m_l.y, den);
    n0 = fmaf(w, ov.x, n0);
    n1 = fmaf(w, ov.y, n1);
  }
  const float inv = den > 0.f ? 1.f / den : 0.f;
  *reinterpret_cast<__nv_bfloat162*>(a.out + (g * kR + r) * a.o_sh + d) = __floats2bfloat162_rn(n0 * inv, n1 * inv);
}

template <int kIt, bool kFused>
__global__ void __launch_bounds__(kThreads) split_kernel(const Args a) {
  constexpr int kWK = 4 * kIt;        // keys per warp per chunk
  constexpr int kBK = kWarps * kWK;   // keys per chunk
  __shared__ __align__(16) float o_s[kWarps][kR][kD];
  __shared__ float m_s[kWarps][kR], l_s[kWarps][kR];
  __shared__ float2 ml_s[kMaxSplits * kR];
  __shared__ int last_s;

  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int grp = lane / 8, dc = lane % 8;  // key of the group of 4, 16-byte column chunk
  const int split = static_cast<int>(blockIdx.x), g = static_cast<int>(blockIdx.y);
  const int k_begin = split * a.keys_per_split;
  const int k_end = min(a.S, k_begin + a.keys_per_split);
  const int n_chunks = (k_end - k_begin + kBK - 1) / kBK;
  const bf16* __restrict__ kb = a.k + g * a.kv_sh + dc * 8;
  const bf16* __restrict__ vb = a.v + g * a.kv_sh + dc * 8;

  pdl_launch_dependents();
  pdl_wait();  // q, the cache's newest key and value come from earlier kernels

  // Keys base + 4·i (i < kIt) of chunk c for this lane: k and v chunks, and the additive bias
  // (the mask, 0 without one, −inf past the split).
  auto load = [&](int c, uint4* kx, uint4* vx, float* bx) {
    const int base = k_begin + c * kBK + warp * kWK + grp;
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      const int key = base + 4 * i;
      if (key < k_end) {
        kx[i] = __ldg(reinterpret_cast<const uint4*>(kb + static_cast<int64_t>(key) * kD));
        vx[i] = __ldg(reinterpret_cast<const uint4*>(vb + static_cast<int64_t>(key) * kD));
        bx[i] = a.mask ? __bfloat162float(a.mask[key]) : 0.f;
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
  float q[kR][8];
#pragma unroll
  for (int r = 0; r < kR; ++r)
    unpack8(__ldg(reinterpret_cast<const uint4*>(a.q + (g * kR + r) * a.q_sh + dc * 8)), q[r]);

  float m_run[kR], l_p[kR], o[kR][8];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    m_run[r] = -INFINITY;
    l_p[r] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[r][e] = 0.f;
  }

  for (int c = 0; c < n_chunks; ++c) {
    uint4 kn[kIt], vn[kIt];
    float bn[kIt];
    if (c + 1 < n_chunks) {
      load(c + 1, kn, vn, bn);
    } else {
#pragma unroll
      for (int i = 0; i < kIt; ++i) {
        kn[i] = make_uint4(0, 0, 0, 0);
        vn[i] = make_uint4(0, 0, 0, 0);
        bn[i] = -INFINITY;
      }
    }
    // Scores of the lane group's keys (identical in the 8 lanes of a group after the shuffles).
    float s[kIt][kR];
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      float kf[8];
      unpack8(kr[i], kf);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        float acc = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc = fmaf(q[r][e], kf[e], acc);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        acc += __shfl_xor_sync(0xffffffffu, acc, 4);
        s[i][r] = acc * a.scale + bias[i];  // bias −inf → −inf (acc is finite: zero rows past the end)
      }
    }
    // Online softmax per row; the chunk max is the warp's (xor 8, 16 cross the 4 key groups).
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      float cm = s[0][r];
#pragma unroll
      for (int i = 1; i < kIt; ++i) cm = fmaxf(cm, s[i][r]);
      cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 8));
      cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 16));
      const float m_new = fmaxf(m_run[r], cm);
      const bool dead = m_new == -INFINITY;  // nothing but keys past the end seen so far
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
    // o += p · v for the lane group's keys and the lane's 8 columns.
#pragma unroll
    for (int i = 0; i < kIt; ++i) {
      float vf[8];
      unpack8(vr[i], vf);
#pragma unroll
      for (int r = 0; r < kR; ++r)
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

  // Sum the 4 key groups of the warp (same max, so plain sums), then the warp's partial to shared.
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    l_p[r] += __shfl_xor_sync(0xffffffffu, l_p[r], 8);
    l_p[r] += __shfl_xor_sync(0xffffffffu, l_p[r], 16);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      o[r][e] += __shfl_xor_sync(0xffffffffu, o[r][e], 8);
      o[r][e] += __shfl_xor_sync(0xffffffffu, o[r][e], 16);
    }
  }
  if (grp == 0) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      float4* dst = reinterpret_cast<float4*>(&o_s[warp][r][dc * 8]);
      dst[0] = make_float4(o[r][0], o[r][1], o[r][2], o[r][3]);
      dst[1] = make_float4(o[r][4], o[r][5], o[r][6], o[r][7]);
    }
    if (dc == 0) {
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        m_s[warp][r] = m_run[r];
        l_s[warp][r] = l_p[r];
      }
    }
  }
  __syncthreads();

  // The block's 4 warps merged, thread (row r, columns d, d + 1).
  const int r = tid / 32, d = 2 * (tid % 32);
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_s[w][r]);
  float L = 0.f, O0 = 0.f, O1 = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float mw = m_s[w][r];
    const float wt = mw == -INFINITY ? 0.f : expf(mw - M);
    L = fmaf(wt, l_s[w][r], L);
    O0 = fmaf(wt, o_s[w][r][d], O0);
    O1 = fmaf(wt, o_s[w][r][d + 1], O1);
  }
  if (a.n_split == 1) {
    const float inv = L > 0.f ? 1.f / L : 0.f;
    *reinterpret_cast<__nv_bfloat162*>(a.out + (g * kR + r) * a.o_sh + d) = __floats2bfloat162_rn(O0 * inv, O1 * inv);
    return;
  }
  const int64_t row = (static_cast<int64_t>(g) * a.n_split + split) * kR + r;  // workspace row (g, split, r)
  *reinterpret_cast<float2*>(a.ws + row * kD + d) = make_float2(O0, O1);
  if (tid % 32 == 0)
    reinterpret_cast<float2*>(a.ws + static_cast<int64_t>(a.Hkv) * a.n_split * kR * kD)[row] = make_float2(M, L);
  if constexpr (kFused) {
    __threadfence();  // this block's partial is visible device-wide before its count
    __syncthreads();
    if (tid == 0) last_s = atomicAdd(&a.counters[g], 1) == a.n_split - 1;
    __syncthreads();
    if (!last_s) return;
    __threadfence();  // the other splits' partials (fenced before their counts) are visible
    merge_splits(a, g, tid, ml_s);
    if (tid == 0) a.counters[g] = 0;
  }
}

__global__ void __launch_bounds__(kThreads) merge_kernel(const Args a) {
  __shared__ float2 ml_s[kMaxSplits * kR];
  pdl_launch_dependents();
  pdl_wait();
  merge_splits(a, static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x), ml_s);
}

struct Variant {
  const char* name;
  int block_keys;  // keys per chunk: keys_per_split is a multiple of it
  int kind;        // 0: <4, merge kernel>, 1: <4, fused>, 2: <2, fused>
};
constexpr Variant kVariants[] = {
    {"regs 64-key chunks + merge kernel", 64, 0},
    {"regs 64-key chunks, fused merge  ", 64, 1},
    {"regs 32-key chunks, fused merge  ", 32, 2},
};

// Splits of `S` keys: `splits` (> 0) rounded to whole chunks, or (0) about 4 blocks per SM of 132
// down to one chunk per split, as decode_attention_plan.
DecodeAttentionPlan plan(int64_t S, int splits, int block_keys) {
  int64_t n = splits > 0 ? splits : (4 * 132 + Hkv - 1) / Hkv;
  n = std::min<int64_t>(n, (S + block_keys - 1) / block_keys);
  DecodeAttentionPlan p;
  p.keys_per_split = ((S + n - 1) / n + block_keys - 1) / block_keys * block_keys;
  p.n_split = static_cast<int>((S + p.keys_per_split - 1) / p.keys_per_split);
  return p;
}

void launch(const Variant& v, Args a, const DecodeAttentionPlan& p, cudaStream_t st) {
  if (p.n_split > kMaxSplits) check("more than kMaxSplits splits", "cand::launch");
  a.n_split = p.n_split;
  a.keys_per_split = static_cast<int>(p.keys_per_split);
  const dim3 grid(static_cast<unsigned>(p.n_split), static_cast<unsigned>(a.Hkv));
  cudaError_t e = cudaSuccess;
  switch (v.kind) {
    case 0:
      e = launch_kernel(split_kernel<4, false>, grid, dim3(kThreads), 0, st, a);
      if (e == cudaSuccess && p.n_split > 1) e = launch_kernel(merge_kernel, dim3(a.Hkv), dim3(kThreads), 0, st, a);
      break;
    case 1: e = launch_kernel(split_kernel<4, true>, grid, dim3(kThreads), 0, st, a); break;
    case 2: e = launch_kernel(split_kernel<2, true>, grid, dim3(kThreads), 0, st, a); break;
  }
  check(e, v.name);
}

}  // namespace cand

// Production decode_attention of the 1B shape over one layer's caches (capacity `cap`) for the first
// S keys; `splits` as attention_plan (0 = the plan's).
void prod_attention(const bf16* q, const bf16* kc, const bf16* vc, int64_t cap, const bf16* mask, bf16* out, float* ws,
                    int64_t S, int splits, cudaStream_t st) {
  DecodeAttentionArgs a;
  a.q = q, a.q_sb = H * D, a.q_sh = D, a.q_st = H * D;
  a.k = kc, a.k_sb = Hkv * cap * D, a.k_sh = cap * D, a.k_ss = D;
  a.v = vc, a.v_sb = Hkv * cap * D, a.v_sh = cap * D, a.v_ss = D;
  a.mask = mask, a.m_sb = 0, a.m_st = 0;
  a.out = out, a.o_sb = H * D, a.o_sh = D, a.o_st = H * D;
  a.workspace = ws;
  a.B = 1, a.H = H, a.Hkv = Hkv, a.T = 1, a.S = S, a.D = D;
  a.scale = 0.125f;
  a.dtype = QDtype::kBFloat16;
  a.plan = attention_plan(S, splits);
  a.kernel = g_kernel;
  a.stream = st;
  check(decode_attention(a), "decode_attention");
}

cand::Args cand_args(const bf16* q, const bf16* kc, const bf16* vc, int64_t cap, const bf16* mask, bf16* out, float* ws,
                     int* counters, int64_t S) {
  cand::Args a;
  a.q = q, a.q_sh = D;
  a.k = kc, a.v = vc, a.kv_sh = cap * D;
  a.mask = mask;
  a.out = out, a.o_sh = D;
  a.ws = ws, a.counters = counters;
  a.Hkv = static_cast<int>(Hkv), a.S = static_cast<int>(S);
  a.scale = 0.125f;
  return a;
}

float host_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::vector<float> to_host(const bf16* p, size_t n) {
  std::vector<uint16_t> h(n);
  check(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost), "copy back");
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = host_bf16(h[i]);
  return f;
}
// max |x − ref| / max |ref|; NaN if x has a NaN or an inf.
double rel_diff(const std::vector<float>& x, const std::vector<float>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return std::nan("");
    md = std::max(md, std::fabs(static_cast<double>(x[i]) - ref[i]));
    mr = std::max(mr, std::fabs(static_cast<double>(ref[i])));
  }
  return mr > 0 ? md / mr : md;
}
// Attention of the 1B shape in double on the host (layer caches of capacity cap, first S keys).
std::vector<float> cpu_attention(const bf16* q, const bf16* kc, const bf16* vc, int64_t cap, const bf16* mask, int64_t S) {
  const std::vector<float> qh = to_host(q, H * D), kh = to_host(kc, Hkv * cap * D), vh = to_host(vc, Hkv * cap * D),
                           mh = to_host(mask, S);
  std::vector<float> out(H * D);
  std::vector<double> sc(S);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / (H / Hkv);
    double mx = -INFINITY;
    for (int64_t j = 0; j < S; ++j) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += static_cast<double>(qh[h * D + d]) * kh[(g * cap + j) * D + d];
      sc[j] = s * 0.125 + mh[j];
      mx = std::max(mx, sc[j]);
    }
    double den = 0;
    for (int64_t j = 0; j < S; ++j) den += (sc[j] = std::exp(sc[j] - mx));
    for (int64_t d = 0; d < D; ++d) {
      double o = 0;
      for (int64_t j = 0; j < S; ++j) o += sc[j] * vh[(g * cap + j) * D + d];
      out[h * D + d] = static_cast<float>(o / den);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t S = argc > 1 ? std::atoll(argv[1]) : 704, pos = argc > 2 ? std::atoll(argv[2]) : 575;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 50;
  cudaStream_t st;
  check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  std::vector<Layer> layers;
  uint32_t seed = 1;
  for (int64_t l = 0; l < L; ++l)
    layers.push_back(Layer{buf(C, seed++, 2.f), buf(C, seed++, 2.f), buf(H * D * C, seed++), buf(Hkv * D * C, seed++),
                           buf(Hkv * D * C, seed++), buf(C * H * D, seed++), buf(I * C, seed++), buf(I * C, seed++),
                           buf(C * I, seed++), buf(Hkv * S * D, seed++, 1.f), buf(Hkv * S * D, seed++, 1.f)});
  Acts t{};
  for (bf16** p : {&t.sum, &t.sum2, &t.normed, &t.q, &t.qr, &t.attn, &t.o, &t.delta}) *p = buf(H * D, seed++, 1.f);
  for (bf16** p : {&t.k, &t.v}) *p = buf(Hkv * D, seed++, 1.f);
  for (bf16** p : {&t.g, &t.u, &t.act}) *p = buf(I, seed++, 1.f);
  t.logits = buf(V, seed++);
  t.cos = buf(D, seed++, 1.f);
  t.sin = buf(D, seed++, 1.f);
  // The mask: 0 up to the position, the lowest bf16 past it.
  std::vector<bf16> m(S);
  for (int64_t j = 0; j < S; ++j) m[j] = __float2bfloat16(j <= pos ? 0.f : -3.38e38f);
  check(cudaMalloc(&t.mask, S * 2), "mask");
  check(cudaMemcpy(t.mask, m.data(), S * 2, cudaMemcpyHostToDevice), "mask copy");
  check(cudaMalloc(&t.pos, 8), "pos");
  check(cudaMemcpy(t.pos, &pos, 8, cudaMemcpyHostToDevice), "pos copy");
  check(cudaMalloc(&t.ws, decode_attention_workspace_floats(Hkv, 1024, H / Hkv, D) * 4), "workspace");
  bf16* final_norm = buf(C, seed++, 2.f);
  bf16* head = buf(V * C, seed++);
  check(cudaDeviceSynchronize(), "setup");
  std::printf("PDL %s, capacity %lld, position %lld\n", pdl_enabled() ? "on" : "off", static_cast<long long>(S),
              static_cast<long long>(pos));
  for (int rep = 0; rep < 2; ++rep) {
    size_t kernels = 0;
    float us = time_graph(st, reps, [&] { step(layers, t, final_norm, head, S, true, st); }, &kernels);
    std::printf("whole step (%zu kernels): %8.1f us = %6.1f tok/s\n", kernels, us, 1e6 / us);
    us = time_graph(st, reps, [&] { step(layers, t, final_norm, head, S, false, st); }, &kernels);
    std::printf("without RoPE/cache/attention (%zu kernels): %8.1f us\n", kernels, us);
  }
  // The attention alone (16 layers' launches in one graph), by kernel and split count: 0 = the
  // plan's; then the whole step with each kernel at its plan.
  const std::vector<int> split_counts =
      S >= 8192 ? std::vector<int>{0, 16, 32, 47, 64, 96, 128} : std::vector<int>{0, 1, 2, 3, 6, 11, 22};
  for (DecodeAttentionKernel kernel : {DecodeAttentionKernel::kCudaCores, DecodeAttentionKernel::kTensorCores}) {
    g_kernel = kernel;
    const char* name = kernel == DecodeAttentionKernel::kTensorCores ? "tensor cores" : "cuda cores";
    for (int splits : split_counts) {
      const DecodeAttentionPlan p = attention_plan(S, splits);
      size_t kernels = 0;
      const float us = time_graph(st, reps, [&] { step(layers, t, final_norm, head, S, true, st, splits, true); }, &kernels);
      std::printf("attention only, %s, %3d splits of %5lld keys (%zu kernels): %7.2f us per layer\n", name, p.n_split,
                  static_cast<long long>(p.keys_per_split), kernels, us / L);
    }
    const float us = time_graph(st, reps, [&] { step(layers, t, final_norm, head, S, true, st); });
    std::printf("whole step, %s, plan's %d splits: %8.1f us = %6.1f tok/s\n", name, attention_plan(S, 0).n_split, us,
                1e6 / us);
  }
  g_kernel = DecodeAttentionKernel::kAuto;
  if (argc > 4 && std::strcmp(argv[4], "nocand") == 0) return 0;
  for (int splits : {6, 11}) {
    size_t kernels = 0;
    const float us = time_graph(st, reps, [&] { step(layers, t, final_norm, head, S, true, st, splits); }, &kernels);
    std::printf("whole step, attention in %d splits (%zu kernels): %8.1f us = %6.1f tok/s\n", attention_plan(S, splits).n_split,
                kernels, us, 1e6 / us);
  }
  // Candidate kernels (namespace cand above) against production: each line times 16 layers'
  // launches in one graph (µs per layer) and gives max|cand − production| / max|production| on
  // layer 0 (production at its own plan; bf16 outputs, so ~1e-2 is rounding, a wrong kernel is ~1).
  // Shapes: the capacity above; 4,160 keys (position 4,031; its own caches); and, untimed, the
  // first S − 3 and S − 54 keys of the capacity-S caches (splits and warps cut mid-chunk).
  {
    const int64_t S2 = 4160, pos2 = S2 - 129;
    std::vector<const bf16*> kc1, vc1, kc2, vc2;
    for (int64_t l = 0; l < L; ++l) {
      kc1.push_back(layers[l].kc), vc1.push_back(layers[l].vc);
      kc2.push_back(buf(Hkv * S2 * D, seed++, 1.f)), vc2.push_back(buf(Hkv * S2 * D, seed++, 1.f));
    }
    std::vector<bf16> m2(S2);
    for (int64_t j = 0; j < S2; ++j) m2[j] = __float2bfloat16(j <= pos2 ? 0.f : -3.38e38f);
    bf16* mask2 = nullptr;
    check(cudaMalloc(&mask2, S2 * 2), "mask2");
    check(cudaMemcpy(mask2, m2.data(), S2 * 2, cudaMemcpyHostToDevice), "mask2 copy");
    bf16* ref = buf(H * D, seed++, 1.f);
    bf16* cand_out = buf(H * D, seed++, 1.f);
    float* cws = nullptr;
    int* counters = nullptr;
    check(cudaMalloc(&cws, Hkv * cand::kMaxSplits * cand::kR * (cand::kD + 2) * 4), "cand workspace");
    check(cudaMalloc(&counters, Hkv * 4), "counters");
    check(cudaMemset(counters, 0, Hkv * 4), "counters zero");
    check(cudaDeviceSynchronize(), "cand setup");
    struct Shape {
      int64_t cap, S;
      const bf16* mask;
      const std::vector<const bf16*>*kc, *vc;
      std::vector<int> splits;
      bool timed;
    };
    std::vector<Shape> shapes = {{S, S, t.mask, &kc1, &vc1, {0, 1, 2, 3, 6, 11, 22}, true},
                                 {S2, S2, mask2, &kc2, &vc2, {0, 1, 11, 22, 33, 65}, true}};
    if (S > 3) shapes.push_back({S, S - 3, t.mask, &kc1, &vc1, {0, 1, 2, 3, 6}, false});
    if (S > 54) shapes.push_back({S, S - 54, t.mask, &kc1, &vc1, {0, 1, 2, 3, 6}, false});
    for (const Shape& sh : shapes) {
      const bf16 *k0 = (*sh.kc)[0], *v0 = (*sh.vc)[0];
      prod_attention(t.qr, k0, v0, sh.cap, sh.mask, ref, t.ws, sh.S, 0, st);
      check(cudaStreamSynchronize(st), "production reference");
      const std::vector<float> ref_h = to_host(ref, H * D);
      std::printf("-- %lld keys (capacity %lld): production (%d splits) vs CPU double: max|diff|/max|out| = %.3g\n",
                  static_cast<long long>(sh.S), static_cast<long long>(sh.cap), attention_plan(sh.S, 0).n_split,
                  rel_diff(ref_h, cpu_attention(t.qr, k0, v0, sh.cap, sh.mask, sh.S)));
      if (sh.timed && sh.S != S)
        for (int splits : sh.splits) {
          const DecodeAttentionPlan p = attention_plan(sh.S, splits);
          const float us = time_graph(st, reps, [&] {
            for (int64_t l = 0; l < L; ++l)
              prod_attention(t.qr, (*sh.kc)[l], (*sh.vc)[l], sh.cap, sh.mask, t.attn, t.ws, sh.S, splits, st);
          });
          std::printf("production,                          %2d splits of %4lld keys: %7.2f us per layer\n", p.n_split,
                      static_cast<long long>(p.keys_per_split), us / L);
        }
      for (const cand::Variant& v : cand::kVariants)
        for (int splits : sh.splits) {
          const DecodeAttentionPlan p = cand::plan(sh.S, splits, v.block_keys);
          check(cudaMemsetAsync(cand_out, 0xff, H * D * 2, st), "poison");  // NaN bf16s: a row never written shows
          cand::launch(v, cand_args(t.qr, k0, v0, sh.cap, sh.mask, cand_out, cws, counters, sh.S), p, st);
          check(cudaStreamSynchronize(st), v.name);
          const double diff = rel_diff(to_host(cand_out, H * D), ref_h);
          float us = 0.f;
          if (sh.timed)
            us = time_graph(st, reps, [&] {
              for (int64_t l = 0; l < L; ++l)
                cand::launch(v, cand_args(t.qr, (*sh.kc)[l], (*sh.vc)[l], sh.cap, sh.mask, cand_out, cws, counters, sh.S), p,
                             st);
            });
          std::printf("cand %s, %2d splits of %4lld keys: %7.2f us per layer, max|diff|/max|prod| = %.3g\n", v.name,
                      p.n_split, static_cast<long long>(p.keys_per_split), us / L, diff);
        }
    }
    check(cudaDeviceSynchronize(), "candidates");
  }
  return 0;
}
