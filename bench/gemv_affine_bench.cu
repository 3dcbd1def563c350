// MLX affine 4-bit decode GEMV micro-benchmark (issue 11): Hearth's gemv() on the Llama-3.1-8B and
// 3.2-1B projections (affine launches: kernels/gemv_affine.cuh), bf16 x, group 64, bf16 scales and
// biases, M = 1, 4 and 8, timed inside a CUDA graph over enough weight copies that nothing stays in
// L2; then at M = 1 the same kernel with each forced number of warps per row group (2^wk_log2 = 1,
// 2, 4, 8) against gemv()'s own choice (affine_wk_log2). Prints µs per launch, TB/s of weight bytes
// (codes + scales + biases) and max |y - y_gemv| / max |y_gemv|, and a decode step's GEMV total.
//   nvcc -std=c++17 -O3 -arch=sm_90 -cudart static -I src/kernels bench/gemv_affine_bench.cu -o /tmp/gab
//   HEARTH_PDL=1 /tmp/gab [reps] [shape substring]
// (gemv.cu is #included below.) Not a test: numbers go in docs/benchmarks.md; the numbers of the
// candidate layouts this kernel was chosen from are at the top of kernels/gemv_affine.cuh.
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
using bf16 = __nv_bfloat16;
using hearth::bench::check;
using hearth::bench::random_bf16;
using hearth::bench::time_graph;
using hearth::kernels::GemvArgs;
using hearth::kernels::QDtype;
using hearth::kernels::WeightFormat;

__global__ void fill_u32(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    p[i] = h;
  }
}

struct Shape {
  const char* name;
  int64_t in;
  std::vector<int64_t> outs;
};

struct Weights {
  std::vector<uint32_t*> w;
  std::vector<bf16*> s, b, y;
};

constexpr int kGroup = 64;

int64_t shape_bytes(const Shape& s) {
  int64_t b = 0;
  for (int64_t o : s.outs) b += o * s.in / 2 + 2 * o * (s.in / kGroup) * 2;
  return b;
}

Weights make(const Shape& s, uint32_t seed) {
  Weights r;
  for (int64_t o : s.outs) {
    uint32_t* w = nullptr;
    const size_t n = static_cast<size_t>(o * s.in / 8);
    check(cudaMalloc(&w, n * 4), "cudaMalloc");
    fill_u32<<<1024, 256>>>(w, n, seed++);
    r.w.push_back(w);
    r.s.push_back(random_bf16(static_cast<size_t>(o * (s.in / kGroup)), seed++, 0.02f));
    r.b.push_back(random_bf16(static_cast<size_t>(o * (s.in / kGroup)), seed++, 0.1f));
    r.y.push_back(random_bf16(static_cast<size_t>(o) * 8, seed++));
  }
  return r;
}

void launch_prod(const Shape& s, const Weights& w, const bf16* x, int M, cudaStream_t st) {
  GemvArgs a;
  a.x = x;
  a.x_dtype = QDtype::kBFloat16;
  a.M = M;
  a.in = s.in;
  a.format = WeightFormat::kAffine4;
  a.group_size = kGroup;
  a.s_dtype = QDtype::kBFloat16;
  a.n_seg = static_cast<int>(s.outs.size());
  for (int i = 0; i < a.n_seg; ++i) a.seg[i] = {w.w[i], w.s[i], w.b[i], w.y[i], s.outs[i]};
  a.stream = st;
  check(hearth::kernels::gemv(a), "gemv");
}

// gemv()'s affine kernel at M = 1 with every segment's warps per row group forced to 2^wkl
// (wkl < 0: affine_wk_log2's choice, i.e. gemv() itself).
void launch_forced(const Shape& s, const Weights& w, const bf16* x, int wkl, cudaStream_t st) {
  using namespace hearth::kernels;
  GemvArgs a;
  a.in = s.in;
  a.n_seg = static_cast<int>(s.outs.size());
  for (int i = 0; i < a.n_seg; ++i) a.seg[i] = {w.w[i], w.s[i], w.b[i], w.y[i], s.outs[i]};
  Segs segs{};
  const int64_t end = fill_segs(
      a, segs, [&](const GemvSegment& g) { return wkl >= 0 ? wkl : affine_wk_log2(s.in / 32, g.out); },
      [](int l) { return int64_t{kAffineRows} * (kWarps >> l); });
  const NormDev nd{};
  check(launch_kernel(gemv_affine_kernel<bf16, bf16, 4, 1, false>, dim3(static_cast<unsigned>(end)), dim3(kThreads), 0, st, x, segs, 1,
                      static_cast<int>(s.in), 6, nd),
        "gemv_affine_kernel");
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const char* only = argc > 2 ? argv[2] : nullptr;  // a substring of the shape names to run
  cudaStream_t st;
  check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  const std::vector<Shape> shapes = {{"8B qkv 4096->4096+1024+1024", 4096, {4096, 1024, 1024}},
                                     {"8B o 4096->4096", 4096, {4096}},
                                     {"8B gate/up 4096->2x14336", 4096, {14336, 14336}},
                                     {"8B down 14336->4096", 14336, {4096}},
                                     {"8B lm_head 4096->128256", 4096, {128256}},
                                     {"1B qkv 2048->2048+512+512", 2048, {2048, 512, 512}},
                                     {"1B o 2048->2048", 2048, {2048}},
                                     {"1B gate/up 2048->2x8192", 2048, {8192, 8192}},
                                     {"1B down 8192->2048", 8192, {2048}},
                                     {"1B lm_head 2048->128256", 2048, {128256}}};
  const bf16* x = random_bf16(8 * 14336, 7, 2.0f);
  std::printf("PDL %s\n", hearth::kernels::pdl_enabled() ? "on" : "off");
  std::vector<float> m1_us(shapes.size(), 0.f);  // gemv() at M = 1, for the step totals
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    if (only && !std::strstr(s.name, only)) continue;
    const int64_t bytes = shape_bytes(s);
    const int copies = static_cast<int>(std::max<int64_t>(4, (int64_t{400} << 20) / bytes));
    std::vector<Weights> set;
    for (int c = 0; c < copies; ++c) set.push_back(make(s, 1000u * i + 10u * c));
    check(cudaDeviceSynchronize(), "fill");
    for (int M : {1, 4, 8}) {
      const float us = time_graph(st, reps, [&] {
        for (const Weights& w : set) launch_prod(s, w, x, M, st);
      }) / copies;
      if (M == 1) m1_us[i] = us;
      std::printf("%-10s %-30s M=%d %8.2f us  %5.2f TB/s\n", "gemv()", s.name, M, us, bytes / (us * 1e-6) / 1e12);
    }
    const Weights& w0 = set[0];
    launch_prod(s, w0, x, 1, st);
    check(cudaStreamSynchronize(st), "gemv");
    std::vector<std::vector<float>> ref;
    for (size_t k = 0; k < s.outs.size(); ++k) ref.push_back(hearth::bench::to_host_f32(w0.y[k], s.outs[k]));
    for (int wkl = 0; wkl < 4; ++wkl) {
      for (size_t k = 0; k < s.outs.size(); ++k) check(cudaMemsetAsync(w0.y[k], 0xff, s.outs[k] * 2, st), "memset");
      launch_forced(s, w0, x, wkl, st);
      check(cudaStreamSynchronize(st), "forced");
      double diff = 0;
      for (size_t k = 0; k < s.outs.size(); ++k)
        diff = std::max(diff, hearth::bench::max_rel_diff(ref[k], hearth::bench::to_host_f32(w0.y[k], s.outs[k])));
      const float us = time_graph(st, reps, [&] {
        for (const Weights& w : set) launch_forced(s, w, x, wkl, st);
      }) / copies;
      std::printf("warps %-4d %-30s M=1 %8.2f us  %5.2f TB/s  diff %.2e\n", 1 << wkl, s.name, us, bytes / (us * 1e-6) / 1e12, diff);
    }
    for (Weights& w : set)
      for (size_t k = 0; k < w.w.size(); ++k) {
        cudaFree(w.w[k]);
        cudaFree(w.s[k]);
        cudaFree(w.b[k]);
        cudaFree(w.y[k]);
      }
  }
  // Step totals at M = 1 (sums of isolated launches): 8B = 32 layers + head, 1B = 16 + head.
  for (int model = 0; model < 2; ++model) {
    const size_t b = model * 5;
    const int layers = model == 0 ? 32 : 16;
    float t = m1_us[b + 4];
    for (size_t k = 0; k < 4; ++k) t += layers * m1_us[b + k];
    std::printf("%s step GEMVs (sum of isolated launches): %.1f us\n", model == 0 ? "8B" : "1B", t);
  }
  return 0;
}
