// The gated delta rule (Gated DeltaNet linear attention) and the depthwise causal conv1d in front
// of it, as tensor ops: ports of transformers' torch_chunk_gated_delta_rule (prefill),
// torch_recurrent_gated_delta_rule (one-token decode) and causal_conv1d_fn/_update
// (modeling_qwen3_5.py, 5.17), differentiable for training. On CUDA with Hearth's kernels built,
// the fused path on (nn::fused_decode_enabled) and nothing for autograd to record, the chunked
// rule's loop over chunks and the whole one-token step run as kernels (kernels/gated_delta.h);
// the tensor ops stay the reference. Not the projections, the gated norm or the cache bookkeeping
// (models/qwen3_5/).
#pragma once
#include <ATen/ATen.h>

#include <utility>

namespace hearth::nn {

/// transformers' l2norm: x · rsqrt(sum(x², dim) + eps).
at::Tensor l2norm(const at::Tensor& x, int64_t dim = -1, double eps = 1e-6);

/// Causal depthwise conv1d with state, then SiLU: x [B, C, T], weight [C, K] (channel c convolves
/// its own K taps), state [B, C, K-1] (the last K-1 inputs before x, oldest first; undefined =
/// zeros). Returns (out [B, C, T] in x's dtype, new state [B, C, K-1] = the last K-1 columns of
/// cat(state, x) in weight's dtype). Same values as transformers' causal_conv1d_fn (zero left
/// padding) and causal_conv1d_update (state). Throws hearth::Error on mismatched shapes.
std::pair<at::Tensor, at::Tensor> causal_conv1d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& state);

/// Result of a gated delta rule over T tokens.
struct GatedDeltaOut {
  at::Tensor out;    // [B, T, Hv, Dv] in query's dtype
  at::Tensor state;  // [B, Hv, Dk, Dv] float32: the state after the last token
};

/// The chunked gated delta rule (torch_chunk_gated_delta_rule with use_qk_l2norm_in_kernel):
/// query/key [B, T, Hk, Dk], value [B, T, Hv, Dv] (Hv % Hk == 0: key head h serves value heads
/// h·Hv/Hk ..), g [B, T, Hv] (log decay, <= 0), beta [B, T, Hv], initial_state [B, Hv, Dk, Dv]
/// (undefined = zeros). q and k are L2-normalised, q scaled by Dk^-1/2, all in float32; the
/// sequence is padded to a multiple of chunk_size and scanned chunk by chunk.
GatedDeltaOut chunk_gated_delta_rule(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                     const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial_state,
                                     int64_t chunk_size = 64);

/// The chunked rule's loop over chunks, after torch_chunk_gated_delta_rule's batched
/// precomputation (all float32, cs tokens per chunk, N chunks): per chunk i, with S the state,
///   v_new = new_values_i − k_cumdecay_i·S;  out_i = q_i·S + intra_i·v_new;
///   S ← S·chunk_decay_i + k_iᵀ·v_new.
/// new_values [B, H, N, cs, Dv]; k_cumdecay, q (decayed from the chunk start, scaled) and k (decayed
/// to the chunk end) [B, H, N, cs, Dk]; intra [B, H, N, cs, cs] (lower triangular); chunk_decay
/// [B, H, N] (exp of the chunk's total log decay); state [B, H, Dk, Dv] (not modified). Returns
/// {out [B, H, N·cs, Dv], final state [B, H, Dk, Dv]}, float32. One kernel (kernels::chunk_scan)
/// where it applies — CUDA, cs = 64, Dk % 4 == 0 and Dk <= 128, the fused path on, no autograd
/// recording — else the tensor-op loop (the reference; the two differ by float32 summation order).
/// Throws hearth::Error on mismatched shapes. Source: Yang et al. 2024, "Gated Delta Networks".
GatedDeltaOut chunk_gated_delta_scan(const at::Tensor& new_values, const at::Tensor& k_cumdecay, const at::Tensor& q,
                                     const at::Tensor& intra, const at::Tensor& k, const at::Tensor& chunk_decay,
                                     const at::Tensor& state);

/// The same rule token by token (torch_recurrent_gated_delta_rule): per t,
/// S ← S·exp(g_t); δ = (v_t − Sᵀk_t)·β_t; S ← S + k_t δᵀ; o_t = Sᵀq_t. Same shapes and result as
/// chunk_gated_delta_rule up to float32 rounding; used for decode (T = 1).
GatedDeltaOut recurrent_gated_delta_rule(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                         const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial_state);

/// Result of a fused one-token step (fused_gated_delta_step).
struct GatedDeltaStep {
  at::Tensor out;         // [B, 1, Hv, Dv] in mixed_qkv's dtype: the rule's output (before the gated norm)
  at::Tensor conv_state;  // [B, convDim, K-1]: the conv window after this token (a new tensor)
  at::Tensor state;       // [B, Hv, Dk, Dv] float32: the recurrent state after this token
};

/// Qwen3_5GatedDeltaNet's cached one-token step from the projections, in one kernel
/// (kernels::gated_delta_step): causal_conv1d_update over [conv_state, mixed_qkv] + SiLU, the split
/// into q / k / v, l2norm(q)·Dk^-½ and l2norm(k), β = sigmoid(b), g = −exp(A_log)·softplus(a +
/// dt_bias) and recurrent_gated_delta_rule's update — the same values as those tensor ops up to
/// float32 summation order. mixed_qkv [B, 1, convDim] (convDim = 2·Hk·Dk + Hv·Dv, channels
/// contiguous), conv_weight [convDim, K], conv_state [B, convDim, K-1], a and b [B, 1, Hv] (heads
/// contiguous) all of one dtype; A_log, dt_bias [Hv] (any float dtype); state [B, Hv, Dk, Dv]
/// float32 contiguous. in_place: the new state is written into `state` itself (a static cache's
/// buffer: no allocation, CUDA-graph safe) and returned; else into a new tensor. Returns an
/// undefined `out`, computing nothing, where the kernel does not apply (not built or switched off,
/// not CUDA, autograd recording, other dtypes, layouts or sizes): the caller runs the tensor ops.
GatedDeltaStep fused_gated_delta_step(const at::Tensor& mixed_qkv, const at::Tensor& conv_weight,
                                      const at::Tensor& conv_state, const at::Tensor& a, const at::Tensor& b,
                                      const at::Tensor& A_log, const at::Tensor& dt_bias, const at::Tensor& state,
                                      int64_t num_k_heads, int64_t head_k_dim, int64_t head_v_dim, bool in_place);

}  // namespace hearth::nn
