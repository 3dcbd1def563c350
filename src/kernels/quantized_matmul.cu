// The MLX affine quantized GEMV entry point (kernels/quantized_matmul.h), now one case of the
// decode GEMV of kernels/gemv.cu (one segment, affine format). No ATen: compiles with `nvcc -c`.
#include <cuda_runtime.h>

#include <cstdint>

#include "dtype.cuh"
#include "gemv.h"
#include "quantized_matmul.h"

namespace hearth::kernels {

bool quantized_gemv_supported(int bits, int group_size, int64_t M, int64_t in, QDtype x_dtype, QDtype s_dtype) {
  return (bits == 4 || bits == 8) && (group_size == 32 || group_size == 64 || group_size == 128) && M >= 1 &&
         M <= 8 && in > 0 && in % group_size == 0 && in <= 0x7fffffff &&
         (s_dtype == x_dtype || s_dtype == QDtype::kFloat32);
}

const char* quantized_gemv(const QuantGemvArgs& a) {
  if (!quantized_gemv_supported(a.bits, a.group_size, a.M, a.in, a.x_dtype, a.s_dtype))
    return "quantized_gemv: unsupported bits/group_size/M/dtypes";
  if (a.out == 0) return nullptr;
  GemvArgs g;
  g.x = a.x;
  g.x_dtype = a.x_dtype;
  g.M = a.M;
  g.in = a.in;
  g.format = a.bits == 8 ? WeightFormat::kAffine8 : WeightFormat::kAffine4;
  g.group_size = a.group_size;
  g.s_dtype = a.s_dtype;
  g.seg[0] = GemvSegment{a.wq, a.scales, a.biases, a.y, a.out};
  g.n_seg = 1;
  g.stream = a.stream;
  return gemv(g);
}

namespace {

// One thread per 32-bit word of codes (32/bits codes, all in one group since group_size is a
// multiple of 32): decode, scale, shift, round, store as 8- or 16-byte vectors.
template <typename TS, typename TW, int Bits>
__global__ void affine_dequantize_kernel(const uint32_t* __restrict__ wq, const TS* __restrict__ scales,
                                         const TS* __restrict__ biases, TW* __restrict__ w, int64_t words,
                                         int64_t words_per_row, int64_t in, int group_size) {
  constexpr int kPer = 32 / Bits;
  constexpr uint32_t kMask = (1u << Bits) - 1u;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / words_per_row;
    const int64_t k0 = (i - row * words_per_row) * kPer;  // first code of this word in its row
    const int64_t g = row * (in / group_size) + k0 / group_size;
    const float s = to_f32(scales[g]), b = to_f32(biases[g]);
    const uint32_t word = wq[i];
    union {
      TW v[kPer];
      uint2 u2[sizeof(TW) * kPer / 8];
    } out;
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      out.v[j] = from_f32<TW>(__fadd_rn(__fmul_rn(static_cast<float>((word >> (j * Bits)) & kMask), s), b));
    uint2* dst = reinterpret_cast<uint2*>(w + row * in + k0);
#pragma unroll
    for (int j = 0; j < static_cast<int>(sizeof(out.u2) / 8); ++j) dst[j] = out.u2[j];
  }
}

template <typename TS, typename TW>
const char* launch_dequantize(const AffineDequantArgs& a) {
  const int64_t words = a.out * (a.in * a.bits / 32);
  const int threads = 256;
  const int64_t want = (words + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < 65535 * 16 ? want : 65535 * 16);
  auto s = static_cast<cudaStream_t>(a.stream);
  auto go = [&](auto kernel) {
    kernel<<<blocks, threads, 0, s>>>(a.wq, static_cast<const TS*>(a.scales), static_cast<const TS*>(a.biases),
                                      static_cast<TW*>(a.w), words, a.in * a.bits / 32, a.in, a.group_size);
  };
  if (a.bits == 2) go(affine_dequantize_kernel<TS, TW, 2>);
  else if (a.bits == 4) go(affine_dequantize_kernel<TS, TW, 4>);
  else go(affine_dequantize_kernel<TS, TW, 8>);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <typename TS>
const char* dequantize_to(const AffineDequantArgs& a) {
  switch (a.w_dtype) {
    case QDtype::kFloat32: return launch_dequantize<TS, float>(a);
    case QDtype::kFloat16: return launch_dequantize<TS, __half>(a);
    case QDtype::kBFloat16: return launch_dequantize<TS, __nv_bfloat16>(a);
  }
  return "affine_dequantize: unknown output dtype";
}

}  // namespace

const char* affine_dequantize(const AffineDequantArgs& a) {
  if ((a.bits != 2 && a.bits != 4 && a.bits != 8) || (a.group_size != 32 && a.group_size != 64 && a.group_size != 128) ||
      a.out < 0 || a.in <= 0 || a.in % a.group_size != 0)
    return "affine_dequantize: unsupported bits/group_size/shape";
  if (!a.wq || !a.scales || !a.biases || !a.w || (reinterpret_cast<uintptr_t>(a.w) & 15u) != 0)
    return "affine_dequantize: a null or misaligned operand";
  if (a.out == 0) return nullptr;
  switch (a.s_dtype) {
    case QDtype::kFloat32: return dequantize_to<float>(a);
    case QDtype::kFloat16: return dequantize_to<__half>(a);
    case QDtype::kBFloat16: return dequantize_to<__nv_bfloat16>(a);
  }
  return "affine_dequantize: unknown scale dtype";
}

}  // namespace hearth::kernels
