// Fused RMSNorm (with an optional residual add) and silu(gate) · up for the decode path: one launch
// each where the tensor-op references launch several over fp32 copies. Not a backward (training
// keeps the autograd ops) and no ATen: it compiles standalone (`nvcc -c`).
#include <cuda_runtime.h>

#include <cstdint>

#include "dtype.cuh"
#include "norm_act.h"

namespace hearth::kernels {
namespace {

constexpr int kNormThreads = 256;

// Rows of up to kNormThreads·kPerThread elements keep their values (and the weight, loaded before
// the reduction so its latency overlaps it) in registers: one pass over global memory. Longer rows
// (kPerThread = 0) re-read them after the reduction. Same arithmetic either way.
template <typename T, int kPerThread>
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ residual, T* __restrict__ sum,
                    const T* __restrict__ w, T* __restrict__ y, int64_t C, float eps, float inv_c) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  const T* rr = residual ? residual + row * C : nullptr;
  T* sr = residual ? sum + row * C : nullptr;
  T* yr = y + row * C;
  float ss = 0.f;
  constexpr int kRegs = kPerThread > 0 ? kPerThread : 1;
  float hv[kRegs], wv[kRegs];
  if constexpr (kPerThread > 0) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
      hv[k] = i < C ? to_f32(xr[i]) : 0.f;
      wv[k] = i < C ? to_f32(w[i]) : 0.f;
      if (rr && i < C) hv[k] += to_f32(rr[i]);
    }
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
      if (rr && i < C) {
        const T s = from_f32<T>(hv[k]);  // torch's add: fp32 opmath, one rounding
        sr[i] = s;
        hv[k] = to_f32(s);
      }
      ss += hv[k] * hv[k];
    }
  } else {
    for (int64_t i = threadIdx.x; i < C; i += kNormThreads) {
      float h = to_f32(xr[i]);
      if (rr) {
        const T s = from_f32<T>(h + to_f32(rr[i]));
        sr[i] = s;
        h = to_f32(s);
      }
      ss += h * h;
    }
  }
  __shared__ float part[kNormThreads / 32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int k = 0; k < kNormThreads / 32; ++k) total += part[k];
  const float r = rsqrtf(total * inv_c + eps);
  if constexpr (kPerThread > 0) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
      if (i < C) yr[i] = from_f32<T>(wv[k] * round_to<T>(hv[k] * r));
    }
  } else {
    const T* src = rr ? sr : xr;  // this thread wrote its own elements of sr above
    for (int64_t i = threadIdx.x; i < C; i += kNormThreads)
      yr[i] = from_f32<T>(to_f32(w[i]) * round_to<T>(to_f32(src[i]) * r));
  }
}

template <typename T>
__global__ void silu_mul_kernel(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float a = to_f32(g[i]);
    const float s = round_to<T>(a / (1.f + expf(-a)));  // at::silu, stored in T
    y[i] = from_f32<T>(s * to_f32(u[i]));
  }
}

template <typename T>
const char* launch_norm(const RmsNormArgs& a) {
  auto s = static_cast<cudaStream_t>(a.stream);
  auto go = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(a.N), kNormThreads, 0, s>>>(
        static_cast<const T*>(a.x), static_cast<const T*>(a.residual), static_cast<T*>(a.sum),
        static_cast<const T*>(a.weight), static_cast<T*>(a.y), a.C, a.eps, 1.f / static_cast<float>(a.C));
  };
  if (a.C <= kNormThreads * 4) go(rms_norm_kernel<T, 4>);
  else if (a.C <= kNormThreads * 16) go(rms_norm_kernel<T, 16>);
  else go(rms_norm_kernel<T, 0>);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <typename T>
const char* launch_silu(const void* g, const void* u, void* y, int64_t n, void* stream) {
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  silu_mul_kernel<T><<<static_cast<unsigned>(blocks < 65535 * 4 ? blocks : 65535 * 4), threads, 0,
                       static_cast<cudaStream_t>(stream)>>>(static_cast<const T*>(g), static_cast<const T*>(u),
                                                            static_cast<T*>(y), n);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* rms_norm(const RmsNormArgs& a) {
  if (a.N < 1 || a.N > 2147483647 || a.C < 1) return "rms_norm: N must be in [1, 2^31) and C >= 1";
  if (!a.x || !a.weight || !a.y || (a.residual && !a.sum)) return "rms_norm: a null operand";
  switch (a.dtype) {
    case QDtype::kFloat32: return launch_norm<float>(a);
    case QDtype::kFloat16: return launch_norm<__half>(a);
    case QDtype::kBFloat16: return launch_norm<__nv_bfloat16>(a);
  }
  return "rms_norm: unknown dtype";
}

const char* silu_mul(const void* gate, const void* up, void* y, QDtype dtype, int64_t n, void* stream) {
  if (n < 1) return "silu_mul: n must be >= 1";
  switch (dtype) {
    case QDtype::kFloat32: return launch_silu<float>(gate, up, y, n, stream);
    case QDtype::kFloat16: return launch_silu<__half>(gate, up, y, n, stream);
    case QDtype::kBFloat16: return launch_silu<__nv_bfloat16>(gate, up, y, n, stream);
  }
  return "silu_mul: unknown dtype";
}

}  // namespace hearth::kernels
