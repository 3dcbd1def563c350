// The gated delta rule (Gated DeltaNet linear attention) and the depthwise causal conv1d in front
// of it, as tensor ops: ports of transformers' torch_chunk_gated_delta_rule (prefill),
// torch_recurrent_gated_delta_rule (one-token decode) and causal_conv1d_fn/_update
// (modeling_qwen3_5.py, 5.17), differentiable for training. Not the projections, the gated norm or
// the cache bookkeeping (models/qwen3_5/), and no fused CUDA kernel.
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

/// The same rule token by token (torch_recurrent_gated_delta_rule): per t,
/// S ← S·exp(g_t); δ = (v_t − Sᵀk_t)·β_t; S ← S + k_t δᵀ; o_t = Sᵀq_t. Same shapes and result as
/// chunk_gated_delta_rule up to float32 rounding; used for decode (T = 1).
GatedDeltaOut recurrent_gated_delta_rule(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                         const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial_state);

}  // namespace hearth::nn
