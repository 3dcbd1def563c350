// Fused cross-entropy forward + backward: one thread block per row of logits computes the row's
// logsumexp with an online (max, Σexp) reduction in fp32, then writes the row's gradient
// scale · (softmax − onehot) in the logits' dtype. Rows are read with 16-byte loads when the row
// length and pointers allow it. Not the loss-head driver (train/loss.cpp) and no ATen: it compiles
// standalone (`nvcc -c`).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cross_entropy.h"
#include "dtype.cuh"

namespace hearth::kernels {
namespace {

constexpr int kThreads = 256;


// (m, s) ⊕ (m2, s2): the pair for the union of two sets, s = Σ exp(x − m).
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  if (m2 > m) {
    s = s * expf(m - m2) + s2;
    m = m2;
  } else {
    s += s2 * expf(m2 - m);
  }
}

__device__ __forceinline__ void add_one(float& m, float& s, float x) {
  if (x > m) {
    s = (m == -INFINITY ? 0.f : s * expf(m - x)) + 1.f;
    m = x;
  } else {
    s += expf(x - m);
  }
}

// Block-wide (m, s) reduction; every thread gets the result.
__device__ __forceinline__ void block_reduce(float& m, float& s) {
  __shared__ float sm[kThreads / 32], ss[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) combine(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  m = -INFINITY;
  s = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) combine(m, s, sm[w], ss[w]);
}

// Vec elements of T in 16 bytes when `vec`, else one element per access.
template <typename T, bool Vec>
__global__ void __launch_bounds__(kThreads) ce_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                                                      int64_t ignore_index, float scale, float* __restrict__ loss_rows,
                                                      T* __restrict__ grad, int64_t V) {
  constexpr int kVec = Vec ? 16 / sizeof(T) : 1;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  T* g = grad + row * V;
  const int64_t t = targets[row];
  const bool keep = t != ignore_index && t >= 0 && t < V;
  const int64_t nv = V / kVec;
  if (!keep) {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) g[i] = from_f32<T>(0.f);
    if (threadIdx.x == 0) loss_rows[row] = 0.f;
    return;
  }
  float m = -INFINITY, s = 0.f;
  for (int64_t i = threadIdx.x; i < nv; i += kThreads) {
    if constexpr (Vec) {
      uint4 raw = reinterpret_cast<const uint4*>(x)[i];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < kVec; ++k) add_one(m, s, to_f32(e[k]));
    } else {
      add_one(m, s, to_f32(x[i]));
    }
  }
  block_reduce(m, s);
  const float lse = m + logf(s);
  if (threadIdx.x == 0) loss_rows[row] = lse - to_f32(x[t]);
  for (int64_t i = threadIdx.x; i < nv; i += kThreads) {
    if constexpr (Vec) {
      uint4 raw = reinterpret_cast<const uint4*>(x)[i];
      const T* e = reinterpret_cast<const T*>(&raw);
      uint4 out;
      T* o = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const int64_t j = i * kVec + k;
        o[k] = from_f32<T>(scale * (expf(to_f32(e[k]) - lse) - (j == t ? 1.f : 0.f)));
      }
      reinterpret_cast<uint4*>(g)[i] = out;
    } else {
      g[i] = from_f32<T>(scale * (expf(to_f32(x[i]) - lse) - (i == t ? 1.f : 0.f)));
    }
  }
}

template <typename T>
const char* launch(const CrossEntropyArgs& a) {
  const auto* x = static_cast<const T*>(a.logits);
  auto* g = static_cast<T*>(a.grad);
  const bool vec = a.V % (16 / sizeof(T)) == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(g) % 16 == 0;
  const auto stream = static_cast<cudaStream_t>(a.stream);
  const dim3 grid(static_cast<unsigned>(a.N));
  if (vec)
    ce_kernel<T, true><<<grid, kThreads, 0, stream>>>(x, a.targets, a.ignore_index, a.scale, a.loss_rows, g, a.V);
  else
    ce_kernel<T, false><<<grid, kThreads, 0, stream>>>(x, a.targets, a.ignore_index, a.scale, a.loss_rows, g, a.V);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* cross_entropy_fwd_bwd(const CrossEntropyArgs& a) {
  if (a.N < 0 || a.V <= 0) return "cross_entropy_fwd_bwd: need N >= 0 and V > 0";
  if (a.N > 2147483647) return "cross_entropy_fwd_bwd: more than 2^31 - 1 rows in one call";
  if (a.N == 0) return nullptr;
  if (a.logits == nullptr || a.targets == nullptr || a.loss_rows == nullptr || a.grad == nullptr)
    return "cross_entropy_fwd_bwd: a null pointer";
  if (a.logits == a.grad) return "cross_entropy_fwd_bwd: grad must not alias logits";
  switch (a.dtype) {
    case QDtype::kFloat32: return launch<float>(a);
    case QDtype::kFloat16: return launch<__half>(a);
    case QDtype::kBFloat16: return launch<__nv_bfloat16>(a);
  }
  return "cross_entropy_fwd_bwd: unknown dtype";
}

}  // namespace hearth::kernels
