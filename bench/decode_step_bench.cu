// A 1B decode step rebuilt from Hearth's kernels alone (issue 11): per layer the fused norm (with
// the previous layer's residual add), q/k/v GEMV, RoPE + cache write, split-K attention, o GEMV,
// add + norm, gate/up GEMV, silu·up, down GEMV; then the final norm and the head GEMV — the kernels
// a replayed `hearth bench` step runs, without ATen, the caching allocator or the sampler. Timed as
// one CUDA graph (median of replays), PDL per HEARTH_PDL. If this is well under the real step's
// time, the difference is outside these kernels. Not a test; numbers go in docs/benchmarks.md.
//   nvcc -std=c++17 -O3 -arch=sm_90 -cudart static -I src/kernels bench/decode_step_bench.cu \
//     src/kernels/{gemv,norm_act,rope_cache,decode_attention}.cu -o /tmp/step_bench
//   HEARTH_PDL=1 /tmp/step_bench [capacity=704] [position=575] [reps=50]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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
DecodeAttentionPlan attention_plan(int64_t S, int splits) {
  const int tk = decode_attention_tile_keys(2, D, H / Hkv);
  if (splits <= 0) return decode_attention_plan(Hkv, S, tk, 132);
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
  // The attention alone (16 layers' launches in one graph), by split count: 0 = the plan's.
  for (int splits : {0, 1, 2, 3, 6, 11, 22}) {
    const DecodeAttentionPlan p = attention_plan(S, splits);
    size_t kernels = 0;
    const float us = time_graph(st, reps, [&] { step(layers, t, final_norm, head, S, true, st, splits, true); }, &kernels);
    std::printf("attention only, %2d splits of %4lld keys (%zu kernels): %7.2f us per layer\n", p.n_split,
                static_cast<long long>(p.keys_per_split), kernels, us / L);
  }
  for (int splits : {6, 11}) {
    size_t kernels = 0;
    const float us = time_graph(st, reps, [&] { step(layers, t, final_norm, head, S, true, st, splits); }, &kernels);
    std::printf("whole step, attention in %d splits (%zu kernels): %8.1f us = %6.1f tok/s\n", attention_plan(S, splits).n_split,
                kernels, us, 1e6 / us);
  }
  return 0;
}
