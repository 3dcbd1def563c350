// Shared pieces of the standalone CUDA micro-benchmarks (bench/*.cu): error checks that exit,
// hashed random bf16 buffers, and graph timing (capture once, median of timed replays, as
// device/METHOD.md asks for many small launches). Not a test helper and not linked into hearth.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace hearth::bench {

/// Exits with "what: reason" when a CUDA call failed.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
/// Exits with "what: err" when a Hearth launcher returned a reason (nullptr = success).
inline void check(const char* err, const char* what) {
  if (err) {
    std::fprintf(stderr, "%s: %s\n", what, err);
    std::exit(1);
  }
}

/// p[i] = uniform in [-scale/2, scale/2) from a hash of (i, seed): never zeros (METHOD.md).
__global__ void fill_kernel(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16((static_cast<float>(h & 0xffff) / 65536.f - 0.5f) * scale);
  }
}

/// A fresh device buffer of n bf16 values filled by fill_kernel.
inline __nv_bfloat16* random_bf16(size_t n, uint32_t seed, float scale = 0.05f) {
  __nv_bfloat16* p = nullptr;
  check(cudaMalloc(&p, n * 2), "cudaMalloc");
  fill_kernel<<<1024, 256>>>(p, n, seed, scale);
  check(cudaGetLastError(), "fill");
  return p;
}

/// µs per replay of a CUDA graph that `body` captures on `st` (median of `reps` timed replays after
/// 3 untimed ones); `*kernels`, when given, gets the graph's node count.
template <typename F>
float time_graph(cudaStream_t st, int reps, F body, size_t* kernels = nullptr) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  check(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "capture");
  body();
  check(cudaStreamEndCapture(st, &g), "end capture");
  check(cudaGraphInstantiate(&ge, g, 0), "instantiate");
  if (kernels) check(cudaGraphGetNodes(g, nullptr, kernels), "graph nodes");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  for (int i = 0; i < 3; ++i) check(cudaGraphLaunch(ge, st), "warm replay");
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(e0, st);
    cudaGraphLaunch(ge, st);
    cudaEventRecord(e1, st);
    check(cudaEventSynchronize(e1), "replay");
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return ms[ms.size() / 2] * 1000.f;
}

/// n bf16 values of a device buffer, copied to the host as floats (synchronous).
inline std::vector<float> to_host_f32(const __nv_bfloat16* p, size_t n) {
  std::vector<__nv_bfloat16> h(n);
  check(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost), "copy to host");
  std::vector<float> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = __bfloat162float(h[i]);
  return r;
}

/// max |a - b| / max |a| over two equally long outputs (a the reference); 0 when a is all zeros and
/// a == b, a huge value (1e30) when a non-finite value or a length mismatch appears.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 1e30;
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double ai = a[i], bi = b[i];
    if (!(ai - ai == 0) || !(bi - bi == 0)) return 1e30;  // NaN or inf
    d = std::max(d, ai > bi ? ai - bi : bi - ai);
    m = std::max(m, ai < 0 ? -ai : ai);
  }
  return m > 0 ? d / m : (d > 0 ? 1e30 : 0.0);
}

}  // namespace hearth::bench
