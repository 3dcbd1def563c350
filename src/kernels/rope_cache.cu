// Fused RoPE on q and k plus the static-cache write of k and v for one decode token per row: one
// launch where the tensor-op path launches ~14 (neg, cat, two muls and an add per tensor, then the
// index arithmetic and two index_copy_); and RoPE alone on one tensor of any length (prompt
// chunks: one launch for seven). No ATen: it compiles standalone (`nvcc -c`).
#include <cuda_runtime.h>

#include <cstdint>

#include "dtype.cuh"
#include "pdl.cuh"
#include "rope_cache.h"

namespace hearth::kernels {
namespace {

constexpr int kRopeThreads = 128;

// rope(x)[d] for d < rot, rounded as PyTorch rounds x*cos + rotate_half(x)*sin: each product
// stored in T, then their sum (the _rn intrinsics keep nvcc from contracting into an FMA).
template <typename T>
__device__ __forceinline__ T rope_at(const T* x, const T* c, const T* s, int64_t d, int64_t half) {
  const float xd = to_f32(x[d]);
  const float other = d < half ? -to_f32(x[d + half]) : to_f32(x[d - half]);
  const float a = round_to<T>(__fmul_rn(xd, to_f32(c[d])));
  const float b = round_to<T>(__fmul_rn(other, to_f32(s[d])));
  return from_f32<T>(__fadd_rn(a, b));
}

template <typename T>
__global__ void __launch_bounds__(kRopeThreads) rope_cache_kernel(RopeCacheArgs a) {
  pdl_launch_dependents();
  pdl_wait();  // q, k, v come from the kernel before
  const int64_t heads = a.Hq + a.Hk;
  const int64_t b = blockIdx.x / heads, h = blockIdx.x % heads;
  const T* c = static_cast<const T*>(a.cos) + b * a.rot;
  const T* s = static_cast<const T*>(a.sin) + b * a.rot;
  const int64_t half = a.rot / 2;
  if (h < a.Hq) {
    const T* x = static_cast<const T*>(a.q) + b * a.q_sb + h * a.q_sh;
    T* y = static_cast<T*>(a.q_out) + b * a.qo_sb + h * a.qo_sh;
    for (int64_t d = threadIdx.x; d < a.D; d += kRopeThreads) y[d] = d < a.rot ? rope_at(x, c, s, d, half) : x[d];
    return;
  }
  const int64_t hk = h - a.Hq;
  const int64_t row = (b * a.Hk + hk) * a.row_stride + a.positions[b];
  const T* x = static_cast<const T*>(a.k) + b * a.k_sb + hk * a.k_sh;
  const T* vx = static_cast<const T*>(a.v) + b * a.v_sb + hk * a.v_sh;
  T* ky = static_cast<T*>(a.k_cache) + row * a.D;
  T* vy = static_cast<T*>(a.v_cache) + row * a.D;
  for (int64_t d = threadIdx.x; d < a.D; d += kRopeThreads) {
    ky[d] = d < a.rot ? rope_at(x, c, s, d, half) : x[d];
    vy[d] = vx[d];
  }
}

// One block per (row b, token t): its H heads' D values, thread i at (head i / D, dim i % D).
template <typename T>
__global__ void __launch_bounds__(kRopeThreads) rope_kernel(RopeArgs a) {
  pdl_launch_dependents();
  pdl_wait();  // x comes from the kernel before
  const int64_t b = blockIdx.x / a.T, t = blockIdx.x % a.T;
  const T* c = static_cast<const T*>(a.cos) + b * a.cs_b + t * a.cs_t;
  const T* s = static_cast<const T*>(a.sin) + b * a.cs_b + t * a.cs_t;
  const int64_t half = a.rot / 2;
  for (int64_t i = threadIdx.x; i < a.H * a.D; i += kRopeThreads) {
    const int64_t h = i / a.D, d = i % a.D;
    const T* x = static_cast<const T*>(a.x) + b * a.x_sb + h * a.x_sh + t * a.x_st;
    T* y = static_cast<T*>(a.y) + b * a.y_sb + h * a.y_sh + t * a.y_st;
    y[d] = d < a.rot ? rope_at(x, c, s, d, half) : x[d];
  }
}

template <typename T>
const char* launch_rope(const RopeArgs& a) {
  const cudaError_t e = launch_kernel(rope_kernel<T>, dim3(static_cast<unsigned>(a.B * a.T)), dim3(kRopeThreads), 0,
                                      static_cast<cudaStream_t>(a.stream), a);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <typename T>
const char* launch(const RopeCacheArgs& a) {
  const cudaError_t e = launch_kernel(rope_cache_kernel<T>, dim3(static_cast<unsigned>(a.B * (a.Hq + a.Hk))),
                                      dim3(kRopeThreads), 0, static_cast<cudaStream_t>(a.stream), a);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* rope(const RopeArgs& a) {
  if (a.B < 1 || a.H < 1 || a.T < 1 || a.D < 1 || a.B * a.T > 2147483647)
    return "rope: B, H, T and D must be >= 1 (and B·T < 2^31)";
  if (a.rot < 2 || a.rot > a.D || a.rot % 2 != 0) return "rope: rot must be even and in [2, D]";
  if (!a.x || !a.y || !a.cos || !a.sin) return "rope: a null operand";
  switch (a.dtype) {
    case QDtype::kFloat32: return launch_rope<float>(a);
    case QDtype::kFloat16: return launch_rope<__half>(a);
    case QDtype::kBFloat16: return launch_rope<__nv_bfloat16>(a);
  }
  return "rope: unknown dtype";
}

const char* rope_cache_write(const RopeCacheArgs& a) {
  if (a.B < 1 || a.Hq < 1 || a.Hk < 1 || a.D < 1 || a.B * (a.Hq + a.Hk) > 2147483647)
    return "rope_cache_write: B, Hq, Hk and D must be >= 1 (and B·(Hq+Hk) < 2^31)";
  if (a.rot < 2 || a.rot > a.D || a.rot % 2 != 0) return "rope_cache_write: rot must be even and in [2, D]";
  if (a.row_stride < 1) return "rope_cache_write: row_stride must be >= 1";
  if (!a.q || !a.k || !a.v || !a.cos || !a.sin || !a.positions || !a.q_out || !a.k_cache || !a.v_cache)
    return "rope_cache_write: a null operand";
  switch (a.dtype) {
    case QDtype::kFloat32: return launch<float>(a);
    case QDtype::kFloat16: return launch<__half>(a);
    case QDtype::kBFloat16: return launch<__nv_bfloat16>(a);
  }
  return "rope_cache_write: unknown dtype";
}

}  // namespace hearth::kernels
