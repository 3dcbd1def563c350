// The 16-byte chunk primitives of the decode GEMV (kernels/gemv.cu, its only includer besides
// bench/gemv_bench.cu through it): a chunk's code count, its ordered loads, x's loads as fp32, and the
// dot product of one chunk of dense values with x (the affine codes' is in gemv_affine.cuh). Device code in gemv.cu's
// anonymous namespace (internal to that translation unit); the layout and measurements behind the
// loads are at the top of gemv.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dtype.cuh"

namespace hearth::kernels {
namespace {

// Codes (values) in one 16-byte chunk of a row: dense 16/sizeof(T), affine 128/bits.
template <typename TX, int Kind>
__host__ __device__ constexpr int codes_per_chunk() {
  return Kind == 0 ? 16 / static_cast<int>(sizeof(TX)) : 128 / Kind;
}

// Σ_j w_j · xf_j over one 16-byte chunk of dense TX values (two accumulators, alternating values).
template <typename TX>
__device__ __forceinline__ float chunk_dot(const uint4& w, const float* xf) {
  constexpr int n = 16 / static_cast<int>(sizeof(TX));
  const TX* e = reinterpret_cast<const TX*>(&w);
  float d0 = 0.f, d1 = 0.f;
#pragma unroll
  for (int k = 0; k < n; k += 2) {
    d0 = fmaf(to_f32(e[k]), xf[k], d0);
    d1 = fmaf(to_f32(e[k + 1]), xf[k + 1], d1);
  }
  return d0 + d1;
}

// Loads N consecutive elements of x (16-byte aligned) to fp32 with 16-byte loads.
template <typename TX, int N>
__device__ __forceinline__ void load_x(const TX* __restrict__ p, float* xf) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(TX));
#pragma unroll
  for (int i = 0; i < N / kPer; ++i) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
    const TX* e = reinterpret_cast<const TX*>(&v);
#pragma unroll
    for (int k = 0; k < kPer; ++k) xf[i * kPer + k] = to_f32(e[k]);
  }
}

// 16 bytes of global memory, loaded where the source puts it: a coherent ld.global (the load
// bench/gemv_bench.cu measured) in an asm volatile with a memory clobber, so NVVM keeps it in order
// with the other loads and with griddepcontrol.wait; ptxas leaves it in place as far as can be told
// without a SASS dump (the bench's register counts follow the source with it, not with __ldg).
// When !ok nothing is read and the result is zero (a predicated load, no branch).
__device__ __forceinline__ uint4 ld16_ordered(const void* p, bool ok) {
  uint4 v;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.ne.b32 p, %5, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@p ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(ok ? 1 : 0)
      : "memory");
  return v;
}

__device__ __forceinline__ uint4 ld16_ordered(const void* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// load_x with ordered loads: the main loop's x (after pdl_wait), as the bench's measured candidates.
template <typename TX, int N>
__device__ __forceinline__ void load_x_ordered(const TX* p, float* xf) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(TX));
#pragma unroll
  for (int i = 0; i < N / kPer; ++i) {
    const uint4 v = ld16_ordered(reinterpret_cast<const uint4*>(p) + i);
    const TX* e = reinterpret_cast<const TX*>(&v);
#pragma unroll
    for (int k = 0; k < kPer; ++k) xf[i * kPer + k] = to_f32(e[k]);
  }
}

}  // namespace
}  // namespace hearth::kernels
