// Fused CUDA GEMV for MLX affine quantized weights (bits 4 and 8), for small M (decode): each
// warp reads the packed codes of a few output rows once, decodes them in registers and dots them
// with every row of x, accumulating in fp32. Not a GEMM for large M (that stays dequantize +
// cuBLAS in nn/quant.cpp) and no ATen: it compiles standalone (`nvcc -c`).
// Layout (mlx/backend/cpu/quantized.cpp, nn/quant.h): code k of a row occupies bits
// [k*bits, (k+1)*bits) of the row's little-endian uint32 stream; w = scale·q + bias per group.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "quantized_matmul.h"
#include "dtype.cuh"

namespace hearth::kernels {
namespace {

constexpr int kWarps = 4;        // warps per block
constexpr int kRowsPerWarp = 4;  // output rows per warp: each chunk of x is reused across them


// A code c < 2^23 placed in the mantissa of 2^23 is the float 2^23 + c exactly; subtracting 2^23
// gives c. Cheaper than an int-to-float conversion (a logic op and an add, both full rate).
__device__ __forceinline__ float code_to_f32(uint32_t mantissa_with_exponent) {
  return __uint_as_float(mantissa_with_exponent) - 8388608.0f;
}

// Σ_j q_j · xf_j over one 16-byte chunk of packed codes (16 codes at 8 bits, 32 at 4 bits).
template <int Bits>
__device__ __forceinline__ float chunk_dot(const uint4& w, const float* xf) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  float d0 = 0.f, d1 = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (Bits == 8) {
#pragma unroll
      for (int k = 0; k < 4; k += 2) {
        // byte k of the word into the low byte of 0x4B000000 (selector nibbles: k, 4, 5, 7).
        d0 = fmaf(code_to_f32(__byte_perm(words[i], 0x4B000000u, 0x7540u | k)), xf[i * 4 + k], d0);
        d1 = fmaf(code_to_f32(__byte_perm(words[i], 0x4B000000u, 0x7540u | (k + 1))), xf[i * 4 + k + 1], d1);
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; k += 2) {
        d0 = fmaf(code_to_f32(0x4B000000u | ((words[i] >> (4 * k)) & 15u)), xf[i * 8 + k], d0);
        d1 = fmaf(code_to_f32(0x4B000000u | ((words[i] >> (4 * k + 4)) & 15u)), xf[i * 8 + k + 1], d1);
      }
    }
  }
  return d0 + d1;
}

// Loads N consecutive elements of x (16-byte aligned) to fp32 with 16-byte loads.
template <typename TX, int N>
__device__ __forceinline__ void load_x(const TX* __restrict__ p, float* xf) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(TX));
  static_assert(N % kPer == 0, "chunk of x is a whole number of 16-byte vectors");
#pragma unroll
  for (int i = 0; i < N / kPer; ++i) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
    const TX* e = reinterpret_cast<const TX*>(&v);
#pragma unroll
    for (int k = 0; k < kPer; ++k) xf[i * kPer + k] = to_f32(e[k]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per kRowsPerWarp output rows; lane l takes 16-byte chunks l, l+32, ... of each row.
// A chunk lies inside one group (group sizes are multiples of the 16 or 32 codes in a chunk), so
// per chunk: acc += scale · (q·x) + bias · Σx. M <= MaxM rows of x, M known at run time.
template <typename TX, typename TS, int Bits, int MaxM>
__global__ void __launch_bounds__(kWarps * 32)
    qgemv_kernel(const TX* __restrict__ x, const uint32_t* __restrict__ wq, const TS* __restrict__ scales,
                 const TS* __restrict__ biases, TX* __restrict__ y, int M, int64_t out, int in, int group_shift) {
  constexpr int kCodes = 128 / Bits;  // codes per 16-byte chunk
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * kRowsPerWarp;
  if (row0 >= out) return;  // the whole warp leaves together
  const int chunks = in / kCodes;
  const int64_t row_words = static_cast<int64_t>(in) * Bits / 32;
  const int ng = in >> group_shift;

  float acc[kRowsPerWarp][MaxM];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < MaxM; ++m) acc[r][m] = 0.f;

  for (int c = lane; c < chunks; c += 32) {
    const int k0 = c * kCodes;
    const int g = k0 >> group_shift;
    uint4 w[kRowsPerWarp];
    float s[kRowsPerWarp], b[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t row = row0 + r;
      if (row < out) {
        w[r] = __ldg(reinterpret_cast<const uint4*>(wq + row * row_words) + c);
        s[r] = to_f32(scales[row * ng + g]);
        b[r] = to_f32(biases[row * ng + g]);
      } else {
        w[r] = make_uint4(0u, 0u, 0u, 0u);
        s[r] = 0.f;
        b[r] = 0.f;
      }
    }
#pragma unroll
    for (int m = 0; m < MaxM; ++m) {
      if (m < M) {
        float xf[kCodes];
        load_x<TX, kCodes>(x + static_cast<int64_t>(m) * in + k0, xf);
        float xs = 0.f;
#pragma unroll
        for (int j = 0; j < kCodes; ++j) xs += xf[j];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) acc[r][m] += s[r] * chunk_dot<Bits>(w[r], xf) + b[r] * xs;
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < MaxM; ++m) {
      if (m < M) {
        const float v = warp_sum(acc[r][m]);
        if (lane == 0 && row0 + r < out) y[static_cast<int64_t>(m) * out + row0 + r] = from_f32<TX>(v);
      }
    }
}

template <typename TX, typename TS, int Bits, int MaxM>
const char* launch(const QuantGemvArgs& a, int group_shift) {
  const int64_t rows_per_block = static_cast<int64_t>(kWarps) * kRowsPerWarp;
  const int64_t blocks = (a.out + rows_per_block - 1) / rows_per_block;
  if (blocks > 0x7fffffff) return "quantized_gemv: too many output rows for one grid";
  qgemv_kernel<TX, TS, Bits, MaxM><<<static_cast<unsigned>(blocks), kWarps * 32, 0,
                                     static_cast<cudaStream_t>(a.stream)>>>(
      static_cast<const TX*>(a.x), a.wq, static_cast<const TS*>(a.scales), static_cast<const TS*>(a.biases),
      static_cast<TX*>(a.y), static_cast<int>(a.M), a.out, static_cast<int>(a.in), group_shift);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <typename TX, typename TS, int Bits>
const char* launch_m(const QuantGemvArgs& a, int group_shift) {
  if (a.M <= 1) return launch<TX, TS, Bits, 1>(a, group_shift);
  if (a.M <= 2) return launch<TX, TS, Bits, 2>(a, group_shift);
  if (a.M <= 4) return launch<TX, TS, Bits, 4>(a, group_shift);
  return launch<TX, TS, Bits, 8>(a, group_shift);
}

template <typename TX, typename TS>
const char* launch_bits(const QuantGemvArgs& a, int group_shift) {
  return a.bits == 8 ? launch_m<TX, TS, 8>(a, group_shift) : launch_m<TX, TS, 4>(a, group_shift);
}

template <typename TX>
const char* launch_scales(const QuantGemvArgs& a, int group_shift) {
  if (a.s_dtype == QDtype::kFloat32) return launch_bits<TX, float>(a, group_shift);
  return launch_bits<TX, TX>(a, group_shift);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool quantized_gemv_supported(int bits, int group_size, int64_t M, int64_t in, QDtype x_dtype, QDtype s_dtype) {
  return (bits == 4 || bits == 8) && (group_size == 32 || group_size == 64 || group_size == 128) && M >= 1 &&
         M <= 8 && in > 0 && in % group_size == 0 && in <= 0x7fffffff &&
         (s_dtype == x_dtype || s_dtype == QDtype::kFloat32);
}

const char* quantized_gemv(const QuantGemvArgs& a) {
  if (!quantized_gemv_supported(a.bits, a.group_size, a.M, a.in, a.x_dtype, a.s_dtype))
    return "quantized_gemv: unsupported bits/group_size/M/dtypes";
  if (!aligned16(a.x) || !aligned16(a.wq)) return "quantized_gemv: x and wq must be 16-byte aligned";
  if (a.out == 0) return nullptr;
  const int group_shift = a.group_size == 32 ? 5 : a.group_size == 64 ? 6 : 7;
  switch (a.x_dtype) {
    case QDtype::kFloat32: return launch_scales<float>(a, group_shift);
    case QDtype::kFloat16: return launch_scales<__half>(a, group_shift);
    case QDtype::kBFloat16: return launch_scales<__nv_bfloat16>(a, group_shift);
  }
  return "quantized_gemv: unknown x dtype";
}

}  // namespace hearth::kernels
