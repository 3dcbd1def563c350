// The pieces of one row's RMSNorm that rms_norm_kernel (norm_act.cu) and the decode GEMV's normed-x
// prologue (gemv.cu) share, so that both give the same bits: the block-wide sum of squares of a row
// walked by 256 threads (thread t takes elements t, t + 256, ... in order; then the warps' xor
// shuffles; then the 8 warp sums in warp order) and the weight's application with PyTorch's
// roundings (LlamaRMSNorm / Gemma4RMSNorm / Qwen3_5RMSNorm, norm_act.h's NormWeight). Device code
// only; included by the .cu files of src/kernels.
#pragma once
#include <cuda_runtime.h>

#include "dtype.cuh"
#include "norm_act.h"

namespace hearth::kernels {

/// Threads that walk one row (the norm kernel's block, the GEMV's block).
constexpr int kRmsRowThreads = 256;

/// Σ of v over the block's 256 threads in a fixed order (xor shuffles within each warp, then the 8
/// warp sums in warp order); every thread gets the total. `part` is 8 floats of shared memory; the
/// caller syncs the block before reusing it. Must be reached by every thread of the block.
__device__ __forceinline__ float rms_row_block_sum(float v, float* part) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.f;
  for (int k = 0; k < kRmsRowThreads / 32; ++k) total += part[k];
  return total;
}

/// One thread's term of the sum of squares: ss + h² as one fused multiply-add.
__device__ __forceinline__ float rms_row_square_add(float ss, float h) { return fmaf(h, h, ss); }

/// The factor the normalised value of an element with weight w (fp32 of the stored weight) is
/// multiplied by: w (kAfterRound), offset + w (kFp32; offset 0 is w itself) or 1 (kNone).
__device__ __forceinline__ float rms_row_weight(NormWeight mode, float w, float offset) {
  if (mode == NormWeight::kNone) return 1.f;
  return mode == NormWeight::kFp32 && offset != 0.f ? offset + w : w;
}

/// The normalised element as stored in T (returned as fp32): h = fp32(s), r = rsqrt(mean + eps), w
/// from rms_row_weight. kAfterRound: round(w · round(h · r)); kFp32: round(h · r · w); kNone:
/// round(h · r).
template <typename T>
__device__ __forceinline__ float rms_row_normed(NormWeight mode, float h, float r, float w) {
  if (mode == NormWeight::kAfterRound) return round_to<T>(w * round_to<T>(h * r));
  if (mode == NormWeight::kFp32) return round_to<T>(h * r * w);
  return round_to<T>(h * r);
}

}  // namespace hearth::kernels
