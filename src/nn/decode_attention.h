// The decode attention dispatch (kernels/decode_attention.cu): softmax(q kᵀ · scale + mask) v for a
// decode step's few query rows per kv head over a long (possibly static, strided) key/value cache,
// by Hearth's split-K "flash-decoding" kernel. Not the general attention (nn/attention.h calls this
// first on CUDA and falls back to its own paths) and no backward.
#pragma once
#include <ATen/ATen.h>

namespace hearth::nn {

/// softmax(q kᵀ · scale + mask) v → [B, H, T, D] (a [B, T, H, D]-contiguous tensor seen through
/// permute(0, 2, 1, 3), so the caller's transpose back to [B, T, H·D] is free) for q [B, H, T, D],
/// k/v [B, Hkv, S, D] (H a multiple of Hkv; query head h uses kv head h / (H/Hkv), read in place:
/// a [B, Hkv, S, D] window of a larger static cache [B, Hkv, C, D] is fine) and an optional additive
/// mask ([T, S] or [B or 1, 1, T or 1, S], floating; 0 = attend, finfo.min = masked; undefined =
/// every key visible). Scores, softmax and the weighted sum run in float32 (one rounding to the
/// dtype at the end; PyTorch's SDPA rounds the probabilities to the dtype before p·v, so bf16
/// results differ from it by about one bf16 rounding). A row whose keys are all masked gets what
/// SDPA gives with that mask (the mean of v for bf16/fp32 finfo.min masks).
/// Applies when Hearth's CUDA kernels are built, the fused decode path is on (nn/fused_ops.h), q/k/v
/// are CUDA fp32/fp16/bf16 of one dtype and device, nothing records autograd, D ∈ {64, 128, 256},
/// R = (H/Hkv)·T ≤ 64 and R·D ≤ 4096, the head dim of q/k/v is contiguous, k/v's other strides are
/// multiples of 16 bytes and their data 16-byte aligned (kernels::decode_attention_supported).
/// Returns an undefined tensor, computing nothing, when it does not apply (the caller then runs its
/// own path); throws hearth::Error when the launch fails. No host sync and only allocations sized
/// by host values (the output and a float32 workspace of B·Hkv·splits·R·(D+2)): CUDA-graph safe.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale);

}  // namespace hearth::nn
