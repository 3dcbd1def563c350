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

// rope_kernel's arithmetic on 16-byte vectors (same bits): thread i takes kN consecutive dims of
// one head, with 32-bit index arithmetic. Needs D and rot / 2 to be multiples of kN (no vector
// straddles the rotated halves or the copied tail), every stride a multiple of kN and 16-byte
// aligned operands. The scalar kernel's 64-bit divisions and 2-byte accesses took 52 µs a call on
// a 4096-token chunk of the 8B shape (H200).
template <typename T>
__global__ void __launch_bounds__(kRopeThreads) rope_vec_kernel(RopeArgs a) {
  pdl_launch_dependents();
  pdl_wait();  // x comes from the kernel before
  constexpr int kN = Vec16<T>::kN;
  const int64_t b = blockIdx.x / a.T, t = blockIdx.x % a.T;
  const T* c = static_cast<const T*>(a.cos) + b * a.cs_b + t * a.cs_t;
  const T* s = static_cast<const T*>(a.sin) + b * a.cs_b + t * a.cs_t;
  const T* xb = static_cast<const T*>(a.x) + b * a.x_sb + t * a.x_st;
  T* yb = static_cast<T*>(a.y) + b * a.y_sb + t * a.y_st;
  const int half = static_cast<int>(a.rot / 2), rot = static_cast<int>(a.rot);
  const int per_head = static_cast<int>(a.D) / kN, n = static_cast<int>(a.H) * per_head;
  for (int i = threadIdx.x; i < n; i += kRopeThreads) {
    const int h = i / per_head, d0 = (i - h * per_head) * kN;
    const T* x = xb + h * a.x_sh;
    T* y = yb + h * a.y_sh;
    Vec16<T> xv = load16(x + d0);
    if (d0 < rot) {
      Vec16<T> ov = load16(x + (d0 < half ? d0 + half : d0 - half)), cv = load16(c + d0), sv = load16(s + d0);
#pragma unroll
      for (int k = 0; k < kN; ++k) {  // rope_at's roundings
        const float other = d0 < half ? -to_f32(ov[k]) : to_f32(ov[k]);
        const float p = round_to<T>(__fmul_rn(to_f32(xv[k]), to_f32(cv[k])));
        const float q = round_to<T>(__fmul_rn(other, to_f32(sv[k])));
        xv[k] = from_f32<T>(__fadd_rn(p, q));
      }
    }
    store16(y + d0, xv);
  }
}

template <typename T>
bool rope_vectors_apply(const RopeArgs& a) {
  constexpr int64_t kN = Vec16<T>::kN;
  const int64_t strides[] = {a.x_sb, a.x_sh, a.x_st, a.y_sb, a.y_sh, a.y_st, a.cs_b, a.cs_t};
  for (int64_t st : strides)
    if (st % kN != 0) return false;
  return a.D % kN == 0 && (a.rot / 2) % kN == 0 && a.H * a.D < (int64_t{1} << 30) && aligned16(a.x) &&
         aligned16(a.y) && aligned16(a.cos) && aligned16(a.sin);
}

template <typename T>
const char* launch_rope(const RopeArgs& a) {
  if (rope_vectors_apply<T>(a)) {
    const cudaError_t e = launch_kernel(rope_vec_kernel<T>, dim3(static_cast<unsigned>(a.B * a.T)), dim3(kRopeThreads),
                                        0, static_cast<cudaStream_t>(a.stream), a);
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
  }
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
