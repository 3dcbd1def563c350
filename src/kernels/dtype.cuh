// Element conversions shared by Hearth's CUDA kernels: fp32 / fp16 / bf16 to and from fp32 with
// round-to-nearest-even, the rounding PyTorch applies when an fp32 result is stored; 16-byte vectors
// of them. Device code
// only; included by the .cu files of src/kernels (not by C++ sources).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace hearth::kernels {

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/// v rounded to T's precision and back: what storing an fp32 result in a T tensor keeps.
template <typename T>
__device__ __forceinline__ float round_to(float v) { return to_f32<T>(from_f32<T>(v)); }

/// One 16-byte vector of T (8 bf16/fp16 or 4 fp32), loaded and stored whole; elements by index.
template <typename T>
struct Vec16 {
  static constexpr int kN = 16 / sizeof(T);
  uint4 bits;
  __device__ __forceinline__ T& operator[](int k) { return reinterpret_cast<T*>(&bits)[k]; }
};

/// The kN elements at p (16-byte aligned) in one load / one store.
template <typename T>
__device__ __forceinline__ Vec16<T> load16(const T* p) {
  return Vec16<T>{*reinterpret_cast<const uint4*>(p)};
}
template <typename T>
__device__ __forceinline__ void store16(T* p, const Vec16<T>& x) {
  *reinterpret_cast<uint4*>(p) = x.bits;
}

/// Whether p may be read or written as 16-byte vectors (host or device).
__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return reinterpret_cast<unsigned long long>(p) % 16 == 0;
}

}  // namespace hearth::kernels
