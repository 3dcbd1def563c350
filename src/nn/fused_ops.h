// Inference-time fused ops of the decode path with their tensor-op references: RMSNorm after a
// residual add, SwiGLU's silu(gate) · up, and a static step's RoPE + cache write. On CUDA with Hearth's kernels built and the fused
// path on (the default; HEARTH_FUSED_DECODE=0 or set_fused_decode(false) switches it off) each runs one kernel
// (kernels/norm_act.h); on the CPU in fp32 the norm and RoPE run one loop each (nn/fused_ops_cpu.h);
// anywhere else, or when autograd needs the graph, the reference ops run.
// Not the modules (nn::RMSNorm, nn::GatedMLP call these) and no backward.
#pragma once
#include <ATen/ATen.h>

#include <utility>

namespace hearth::nn {

/// Whether the fused kernels may run: on unless HEARTH_FUSED_DECODE=0 at start-up, or the last
/// set_fused_decode. On an H200 (1B shape, bf16, 128 tokens) they took graph decode from 351 to
/// 422 tok/s and MLX 4-bit from 380 to 471; off, the arithmetic is transformers' op for op (the
/// CUDA bit-parity tier, tests/models/cuda_parity_test.cpp, runs with them off).
bool fused_decode_enabled();
/// Switches the fused path on or off (tests); returns the previous setting.
bool set_fused_decode(bool on);

/// RAII: the fused path is off on the calling thread while the scope lives (scopes nest). Training
/// holds one: its forwards without a graph (segment boundaries, reference log-probs) must round as
/// the recomputation with a graph does, which always takes the reference ops — else the segmented
/// backward's gradients would drift from the full backward's on CUDA.
class FusedDecodeOff {
 public:
  FusedDecodeOff();
  ~FusedDecodeOff();
  FusedDecodeOff(const FusedDecodeOff&) = delete;
  FusedDecodeOff& operator=(const FusedDecodeOff&) = delete;
};

/// {s, y}: s = x + residual (residual omitted when undefined: s = x), y = weight · RMSNorm(s) in
/// transformers' LlamaRMSNorm op order. x, residual [..., C] and weight [C] of one float dtype.
/// The fused kernel rounds as the reference does except for the sum of squares' order (y within
/// one rounding of the dtype). On the CPU, fp32 contiguous tensors take one loop
/// (nn/fused_ops_cpu.h: the sum bit-identical, y within a rounding or two: the sum of squares in
/// double); other CPU dtypes run the reference, as everything does when autograd records (grad mode
/// on and an input requires grad) or when switched off. While autograd
/// records, the norm is nn::rms_norm_lean (nn/lean_grad.h: the reference's values, a lean backward).
std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                               double eps);

/// How fused_rms_norm applies the weight after h = fp32(x), r = rsqrt(mean(h²) + eps):
enum class NormScale {
  kAfterRound,  // round(w · round(h · r)): LlamaRMSNorm's order (and Qwen3_5RMSNormGated's first part)
  kFp32,        // round(h · r · (offset + fp32(w))): Gemma4RMSNorm (offset 0), Qwen3_5RMSNorm (offset 1)
  kNone,        // round(h · r): a weightless norm (Gemma 4's v_norm); weight undefined
};

/// The other families' RMSNorm variants in one kernel (kernels/norm_act.h) for inference: x [..., C]
/// (rows may be strided, the last dim contiguous), weight [C] in x's dtype (undefined with kNone).
/// Optionally, after the norm, `· silu(fp32(gate))` (Qwen3_5RMSNormGated; gate [..., C]) or
/// `add_after + normed` (a sandwich norm's residual add, Gemma 4; add_after [..., C]) — each rounded
/// where the reference's separate op rounds. Returns y [..., C] contiguous, within one rounding of
/// the reference ops (the sum of squares' order), or an undefined tensor, computing nothing, where
/// the kernel does not apply (not built or switched off, not CUDA, mixed dtypes, autograd
/// recording, rows not uniformly strided): the caller then runs its reference ops. Throws
/// hearth::Error on mismatched shapes or a failed launch.
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, NormScale scale, double offset = 0.0,
                          const at::Tensor& gate = {}, const at::Tensor& add_after = {});

/// {s, y}: s = x + residual rounded to x's dtype, y = fused_rms_norm(s, weight, eps, scale, offset)
/// — a family's residual add and the norm after it in one kernel (x, residual [..., C] contiguous).
/// Both undefined, computing nothing, where fused_rms_norm would not apply. Throws as it does.
std::pair<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps, NormScale scale,
                                                     double offset = 0.0);

/// at::silu(gate) * up ([..., I] each, one float dtype); the fused kernel is bit-identical to it.
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up);

/// apply_rotary(x, cos, sin)'s values from one kernel (kernels/rope_cache.h rope): x [B, H, T, D]
/// (any strides, the head dim contiguous); cos, sin [T, rot] or [B or 1, 1, T or 1, rot] with the
/// last dim contiguous, rot even and <= D (the dims past rot copied). The result has x's shape
/// (empty_like's strides). Bit-identical to the tensor ops. Undefined tensor, computing nothing,
/// where the kernel does not apply (not built or switched off, mixed dtypes, autograd recording,
/// other shapes): nn::apply_rotary then runs its tensor ops. On the CPU, fp32 only, one loop
/// (nn/fused_ops_cpu.h), bit-identical too. Throws Error on a launch failure.
at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// A static decode step's RoPE and cache write in one kernel (kernels/rope_cache.h): returns
/// apply_rotary(q, cos, sin) (same shape and strides as q) after writing apply_rotary(k, cos, sin)
/// and v at each row's position into the static cache storage — bit-identical to nn::apply_rotary
/// followed by cache::StaticKVCache::update. q [B, Hq, 1, D], k and v [B, Hk, 1, D] (any strides
/// with the head dim contiguous); cos, sin [B, rot] worth of contiguous rows (e.g. [B, 1, 1, rot]);
/// positions [B] int64 on the device; flat_keys, flat_values [N, D] contiguous, token p of (row b,
/// head h) at (b·Hk + h)·row_stride + p (StaticKVCache::flat_keys()). Returns an undefined tensor,
/// writing nothing, where the kernel does not apply (not built or switched off, not CUDA, mixed
/// dtypes, autograd recording, other shapes): the caller then runs the tensor ops. Positions are
/// not checked on the host (a sync); the static runner keeps them below capacity.
at::Tensor rope_cache_write(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& positions, const at::Tensor& flat_keys,
                            const at::Tensor& flat_values, int64_t row_stride);

}  // namespace hearth::nn
