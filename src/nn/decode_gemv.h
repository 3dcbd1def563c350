// The decode GEMV dispatch (kernels/gemv.cu): y_i = x · W_iᵀ for a few rows of x and up to three
// weights sharing x (q/k/v, gate/up) in one launch, dense or MLX affine. Not the Linear module
// (Linear::forward / Linear::forward_many call this and fall back to their own ops) and no backward.
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "nn/quant.h"

namespace hearth::nn {

/// One weight of decode_gemv: a dense [out, in] tensor, or (when `quant` is set) an MLX affine one;
/// optionally with a LoRA term added in the launch's epilogue (one row of x only): the product is
/// then x · Wᵀ + lora_scale · lora_h · lora_bᵀ, rounded once, where lora_h = x · Aᵀ came from an
/// earlier decode_gemv (so already rounded to x's dtype, as PEFT's lora_A output is).
struct GemvOperand {
  at::Tensor dense;
  const QuantizedWeight* quant = nullptr;
  at::Tensor lora_b{};  // [out, r] in x's dtype, contiguous, on x's device; undefined: no LoRA term
  at::Tensor lora_h{};  // [..., r] (one row) in x's dtype, contiguous
  double lora_scale = 0.0;
};

/// {x · W_0ᵀ, x · W_1ᵀ, ...} ([..., out_i] each, x's dtype) through one launch of Hearth's GEMV
/// kernel, accumulated in fp32 (a different summation order from cuBLAS: results within one
/// rounding of the dtype). Applies when the fused decode path is on (nn/fused_ops.h), Hearth's CUDA
/// kernels are built, x [..., in] is CUDA fp32/fp16/bf16 with x.numel()/in ≤ 8 rows, nothing needs
/// a gradient, 1 ≤ |ws| ≤ 3, and the weights are all dense in x's dtype or all affine with one
/// bits/group_size/scale dtype, on x's device (a LoRA term: one row of x, lora_b / lora_h as
/// GemvOperand says, rank ≤ kernels::kGemvMaxLoraRank). Returns an empty vector when it does not apply (the
/// caller then runs its own ops); throws hearth::Error when the launch fails.
std::vector<at::Tensor> decode_gemv(const at::Tensor& x, const std::vector<GemvOperand>& ws);

/// decode_gemv's products of an input still to be normalised, with the norm's own results.
struct NormedGemv {
  at::Tensor sum;              // x + residual ([..., in], x's dtype), or x itself without a residual
  at::Tensor normed;           // LlamaRMSNorm(sum) ([..., in]), as nn::add_rms_norm's kernel gives it
  std::vector<at::Tensor> ys;  // [..., out_i] each; empty when the kernel did not apply
};

/// {s, RMSNorm(s), {RMSNorm(s) · W_iᵀ}} for s = x (+ residual): LlamaRMSNorm (weight [in] in x's
/// dtype, `eps`) applied inside the GEMV launch (kernels/gemv.h GemvNorm) instead of a norm kernel
/// before it — one dependent launch fewer per norm of a decode step. s and RMSNorm(s) are the same
/// bits as nn::add_rms_norm's CUDA kernel (both walk a row as kernels/rms_row.cuh does); the
/// products are decode_gemv's of RMSNorm(s) within fp32 summation order (a normed launch gives a
/// row one warp, where a plain dense one may spread it over several). Applies where decode_gemv applies and the weight matches x (dtype, device, [in]), the
/// residual (when defined) x's shape and dtype, nothing needing a gradient, and the normed rows fit
/// the kernel's shared memory; otherwise returns ys empty (the caller then runs the norm and its
/// products itself). Throws hearth::Error when the launch fails.
NormedGemv decode_gemv_normed(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                              const std::vector<GemvOperand>& ws);

/// The most output rows (summed over the Linears) for which Linear::forward_many_normed runs the
/// norm inside the GEMV launch. Every block of a normed launch computes the whole norm (one warp per
/// row, 8 rows a block), so its cost grows with the rows: in the 1B step (H200, bf16) the q/k/v
/// launch (3,072 rows, 384 blocks) took 7.2–9.0 µs with the norm against 4.4–4.9 + a 4.3 µs norm
/// kernel unfused, the gate/up launch (16,384 rows) 30–34 µs against 20.4 + 4.6.
constexpr int64_t kGemvNormMaxRows = 4096;

/// The row limit Linear::forward_many_normed applies: kGemvNormMaxRows, or HEARTH_GEMV_NORM_MAX_ROWS
/// when set to an integer ≥ 0 (read once; other values are ignored). A measuring knob: the MLX
/// affine kernel (kernels/gemv_affine.cuh) normalises once per 16–32 rows, not per 8, so its best
/// limit may differ (the 8B's q/k/v have 6,144 rows).
int64_t gemv_norm_max_rows();

/// Whether Linear::forward_many_normed may use decode_gemv_normed: HEARTH_GEMV_NORM=0 turns it off
/// (the norm kernel, then the GEMV); on otherwise. Read once.
bool gemv_norm_enabled();

/// The most rows of x for which Linear sends a *dense* product to decode_gemv rather than cuBLAS:
/// 1 (HEARTH_DENSE_GEMV_MAX_ROWS=1..8 changes it; read once). The kernel's cost grows with the rows
/// (each re-reads x per weight chunk: on the H200 the 1B's gate/up took 20 µs at 1 row, 44 at 4 and
/// 79 at 8, where cuBLAS reads the weight once for 16 rows in about what one row costs here), so a
/// batched step's dense products go to cuBLAS. Affine (MLX) weights have no cuBLAS path and keep
/// the kernel up to its 8 rows.
int64_t dense_gemv_max_rows();

/// Rows of x as decode_gemv counts them: x.numel() / x.size(-1) (0 for an empty last dim).
int64_t gemv_rows(const at::Tensor& x);

}  // namespace hearth::nn
