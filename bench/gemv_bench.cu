// Decode GEMV micro-benchmark (issue 11): Hearth's kernels/gemv.cu on the 1B shape's projections,
// M = 1, timed inside a CUDA graph over enough distinct weight copies that nothing stays in L2.
// Prints µs per launch and TB/s per shape, and a 16-layer chain (q/k/v, o, gate/up, down, each
// layer its own weights) as a replayed decode step runs it. HEARTH_PDL=0/1 picks plain or
// programmatic dependent launches (kernels/pdl.cuh). Not a test: numbers go in docs/benchmarks.md.
//   nvcc -std=c++17 -O3 -arch=sm_90 -I src/kernels bench/gemv_bench.cu -o /tmp/gemv_bench
//   HEARTH_PDL=1 /tmp/gemv_bench [reps]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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
    part[u] = hearth::kernels::chunk_dot<__nv_bfloat16, 0>(w[u], xf);
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
