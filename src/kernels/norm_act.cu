// Fused RMSNorm (with an optional residual add) and silu(gate) · up for the decode path: one launch
// each where the tensor-op references launch several over fp32 copies. Not a backward (training
// keeps the autograd ops) and no ATen: it compiles standalone (`nvcc -c`).
#include <cuda_runtime.h>

#include <cstdint>

#include "dtype.cuh"
#include "norm_act.h"
#include "pdl.cuh"
#include "rms_row.cuh"

namespace hearth::kernels {
namespace {

constexpr int kNormThreads = kRmsRowThreads;  // one row per block, walked as rms_row.cuh walks it

// One launch's operands, typed (RmsNormArgs with the row stride resolved).
template <typename T>
struct NormOperands {
  const T* x;
  const T* residual;
  T* sum;
  const T* w;
  const T* gate;
  const T* add_after;
  T* y;
  int64_t C, x_stride;
  float eps, inv_c, offset;
  NormWeight mode;
};

// The factor element i's normalised value is multiplied by (before any rounding of the product).
template <typename T>
__device__ __forceinline__ float norm_weight(const NormOperands<T>& p, int64_t i) {
  return p.mode == NormWeight::kNone ? 1.f : rms_row_weight(p.mode, to_f32(p.w[i]), p.offset);
}

// The element of gate or add_after that follows the norm (0 when neither is given).
template <typename T>
__device__ __forceinline__ float norm_extra(const NormOperands<T>& p, int64_t at) {
  return p.gate ? to_f32(p.gate[at]) : p.add_after ? to_f32(p.add_after[at]) : 0.f;
}

// y[i] from h = fp32(s[i]), the row's r, the element's weight factor and its norm_extra value,
// rounded as the reference's separate ops round (each stored tensor is one rounding to T).
template <typename T>
__device__ __forceinline__ T norm_out(const NormOperands<T>& p, float h, float r, float w, float extra) {
  float v = rms_row_normed<T>(p.mode, h, r, w);
  if (p.gate) {
    v = v * (extra / (1.f + expf(-extra)));  // Qwen3_5RMSNormGated: · silu(gate.float()), rounded once at the end
  } else if (p.add_after) {
    v = extra + v;  // residual + norm(x)
  }
  return from_f32<T>(v);
}

// Rows of up to kNormThreads·kPerThread elements keep their values (and the weight, loaded before
// the reduction so its latency overlaps it) in registers: one pass over global memory. Longer rows
// (kPerThread = 0) re-read them after the reduction. Same arithmetic either way.
template <typename T, int kPerThread>
__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(const NormOperands<T> p) {
  const int64_t row = blockIdx.x, C = p.C;
  const T* xr = p.x + row * p.x_stride;
  const T* rr = p.residual ? p.residual + row * C : nullptr;
  T* sr = p.residual ? p.sum + row * C : nullptr;
  T* yr = p.y + row * C;
  float ss = 0.f;
  constexpr int kRegs = kPerThread > 0 ? kPerThread : 1;
  float hv[kRegs], wv[kRegs], ev[kRegs];  // ev: gate / add_after, loaded before the reduction too
  pdl_launch_dependents();
  if constexpr (kPerThread > 0) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {  // the weight is a constant: read before the wait
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
      wv[k] = i < C ? norm_weight(p, i) : 0.f;
    }
    pdl_wait();
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
      hv[k] = i < C ? to_f32(xr[i]) : 0.f;
      ev[k] = i < C ? norm_extra(p, row * C + i) : 0.f;
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
      ss = rms_row_square_add(ss, hv[k]);
    }
  } else {
    pdl_wait();
    for (int64_t i = threadIdx.x; i < C; i += kNormThreads) {
      float h = to_f32(xr[i]);
      if (rr) {
        const T s = from_f32<T>(h + to_f32(rr[i]));
        sr[i] = s;
        h = to_f32(s);
      }
      ss = rms_row_square_add(ss, h);
    }
  }
  __shared__ float part[kNormThreads / 32];
  const float total = rms_row_block_sum(ss, part);
  const float r = rsqrtf(total * p.inv_c + p.eps);
  if constexpr (kPerThread > 0) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
      if (i < C) yr[i] = norm_out(p, hv[k], r, wv[k], ev[k]);
    }
  } else {
    const T* src = rr ? sr : xr;  // this thread wrote its own elements of sr above
    for (int64_t i = threadIdx.x; i < C; i += kNormThreads)
      yr[i] = norm_out(p, to_f32(src[i]), r, norm_weight(p, i), norm_extra(p, row * C + i));
  }
}

// Many rows (prompt chunks): rms_norm_kernel's arithmetic and summation order exactly (same bits),
// with the row's global loads and stores in 16-byte vectors staged through shared memory (C floats
// of h, dynamic) instead of 2-byte accesses from registers: the register-held kernel's 84-89
// registers allow 2 blocks an SM, which left a 4096-token prefill's norms at ~0.8 TB/s (H200).
// Needs C and the row stride to be multiples of 16 / sizeof(T) and 16-byte aligned operands.
template <typename T>
__global__ void __launch_bounds__(kNormThreads) rms_norm_staged_kernel(const NormOperands<T> p) {
  extern __shared__ float hs[];  // the row's h: fp32 of x, or of the rounded x + residual
  constexpr int kN = Vec16<T>::kN;
  const int64_t row = blockIdx.x, C = p.C, nv = C / kN;
  const T* xr = p.x + row * p.x_stride;
  const T* rr = p.residual ? p.residual + row * C : nullptr;
  T* sr = p.residual ? p.sum + row * C : nullptr;
  T* yr = p.y + row * C;
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t v = threadIdx.x; v < nv; v += kNormThreads) {
    Vec16<T> x = load16(xr + v * kN);
    if (rr) {
      Vec16<T> r = load16(rr + v * kN);
#pragma unroll
      for (int k = 0; k < kN; ++k) x[k] = from_f32<T>(to_f32(x[k]) + to_f32(r[k]));  // torch's add
      store16(sr + v * kN, x);
    }
#pragma unroll
    for (int k = 0; k < kN; ++k) hs[v * kN + k] = to_f32(x[k]);
  }
  __syncthreads();
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < C; i += kNormThreads) ss = rms_row_square_add(ss, hs[i]);
  __shared__ float part[kNormThreads / 32];
  const float r = rsqrtf(rms_row_block_sum(ss, part) * p.inv_c + p.eps);
  for (int64_t v = threadIdx.x; v < nv; v += kNormThreads) {
    Vec16<T> w{}, y;
    if (p.mode != NormWeight::kNone) w = load16(p.w + v * kN);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const int64_t i = v * kN + k;
      const float wk = p.mode == NormWeight::kNone ? 1.f : rms_row_weight(p.mode, to_f32(w[k]), p.offset);
      y[k] = norm_out(p, hs[i], r, wk, norm_extra(p, row * C + i));
    }
    store16(yr + v * kN, y);
  }
}

// silu(g)·u as at::silu then the product compute it: silu rounded to T, the product in fp32, then T.
template <typename T>
__device__ __forceinline__ T silu_mul_one(T g, T u) {
  const float a = to_f32(g);
  const float s = round_to<T>(a / (1.f + expf(-a)));  // at::silu, stored in T
  return from_f32<T>(s * to_f32(u));
}

template <typename T>
__global__ void silu_mul_kernel(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y, int64_t n) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = silu_mul_one(g[i], u[i]);
  }
}

// silu_mul_kernel's arithmetic on 16-byte vectors (same bits): n a multiple of 16 / sizeof(T),
// operands 16-byte aligned. Scalar 2-byte accesses moved a 4096-token chunk's [4096, 14336] at
// ~1.3 TB/s (H200).
template <typename T>
__global__ void silu_mul_vec_kernel(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y, int64_t nv) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < nv;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Vec16<T> a = load16(g + v * Vec16<T>::kN), b = load16(u + v * Vec16<T>::kN);
#pragma unroll
    for (int k = 0; k < Vec16<T>::kN; ++k) a[k] = silu_mul_one(a[k], b[k]);
    store16(y + v * Vec16<T>::kN, a);
  }
}

// Rows from which the norm takes the staged kernel (bits equal; the register kernel's single pass
// is the quicker one for decode's few rows).
constexpr int64_t kStagedMinRows = 16;

template <typename T>
const char* launch_norm(const RmsNormArgs& a) {
  auto s = static_cast<cudaStream_t>(a.stream);
  const NormOperands<T> p{static_cast<const T*>(a.x),    static_cast<const T*>(a.residual),
                          static_cast<T*>(a.sum),          static_cast<const T*>(a.weight),
                          static_cast<const T*>(a.gate),   static_cast<const T*>(a.add_after),
                          static_cast<T*>(a.y),            a.C,
                          a.x_stride > 0 ? a.x_stride : a.C, a.eps,
                          1.f / static_cast<float>(a.C),   a.weight_offset,
                          a.mode};
  constexpr int64_t kN = Vec16<T>::kN;
  const size_t staged_smem = static_cast<size_t>(a.C) * sizeof(float);
  if (a.N >= kStagedMinRows && a.C % kN == 0 && p.x_stride % kN == 0 && staged_smem <= 48 * 1024 &&
      aligned16(a.x) && aligned16(a.y) && (!a.residual || (aligned16(a.residual) && aligned16(a.sum))) &&
      (a.mode == NormWeight::kNone || aligned16(a.weight))) {
    const cudaError_t e = launch_kernel(rms_norm_staged_kernel<T>, dim3(static_cast<unsigned>(a.N)),
                                        dim3(kNormThreads), staged_smem, s, p);
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
  }
  auto go = [&](auto kernel) { return launch_kernel(kernel, dim3(static_cast<unsigned>(a.N)), dim3(kNormThreads), 0, s, p); };
  const cudaError_t e = a.C <= kNormThreads * 4    ? go(rms_norm_kernel<T, 4>)
                        : a.C <= kNormThreads * 16 ? go(rms_norm_kernel<T, 16>)
                                                   : go(rms_norm_kernel<T, 0>);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <typename T>
const char* launch_silu(const void* g, const void* u, void* y, int64_t n, void* stream) {
  const int threads = 256;
  constexpr int64_t kN = Vec16<T>::kN;
  if (n % kN == 0 && aligned16(g) && aligned16(u) && aligned16(y)) {
    const int64_t nv = n / kN, vblocks = (nv + threads - 1) / threads;
    const cudaError_t e = launch_kernel(silu_mul_vec_kernel<T>, dim3(static_cast<unsigned>(vblocks < 65535 * 4 ? vblocks : 65535 * 4)),
                                        dim3(threads), 0, static_cast<cudaStream_t>(stream), static_cast<const T*>(g),
                                        static_cast<const T*>(u), static_cast<T*>(y), nv);
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
  }
  const int64_t blocks = (n + threads - 1) / threads;
  const cudaError_t e = launch_kernel(silu_mul_kernel<T>, dim3(static_cast<unsigned>(blocks < 65535 * 4 ? blocks : 65535 * 4)),
                                      dim3(threads), 0, static_cast<cudaStream_t>(stream), static_cast<const T*>(g),
                                      static_cast<const T*>(u), static_cast<T*>(y), n);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* rms_norm(const RmsNormArgs& a) {
  if (a.N < 1 || a.N > 2147483647 || a.C < 1) return "rms_norm: N must be in [1, 2^31) and C >= 1";
  if (!a.x || (!a.weight && a.mode != NormWeight::kNone) || !a.y || (a.residual && !a.sum))
    return "rms_norm: a null operand";
  if (a.gate && a.add_after) return "rms_norm: gate and add_after together";
  if (a.x_stride != 0 && a.x_stride < a.C) return "rms_norm: x_stride below C";
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
