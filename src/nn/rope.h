// Rotary position embeddings: RoPE parameters from config.json (transformers 4.x `rope_theta` +
// `rope_scaling`, and 5.x `rope_parameters`), inv_freq per scaling type, cos/sin tables and
// `apply_rotary_pos_emb`. Ports transformers' modeling_rope_utils.py and LlamaRotaryEmbedding.
// Not attention: see attention.h.
#pragma once
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace hearth::nn {

/// RoPE settings of one model (or one layer type). Types: default, linear, dynamic, llama3, yarn.
struct RopeParams {
  std::string type = "default";
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  double factor = 1.0;                               // linear, dynamic, llama3, yarn
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  std::optional<int64_t> original_max_position_embeddings;  // llama3 (required), yarn (optional)
  std::optional<double> attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim;  // yarn
  bool truncate = true;                              // yarn

  /// Reads RoPE from a config.json object: `rope_parameters` (5.x) if present, else `rope_theta`
  /// (default 10000) + `rope_scaling` (null or {type|rope_type, factor, ...}). Throws hearth::Error
  /// "<origin>: <field> ..." for an unsupported rope type or a missing required field.
  static RopeParams from_json(const nlohmann::json& config, const std::string& origin);
};

/// The result of a RoPE init function: inv_freq [D/2] float32 (CPU) and the factor cos/sin are
/// multiplied by (`attention_scaling`; yarn's mscale, else 1).
struct RopeInit {
  at::Tensor inv_freq;
  double attention_scaling = 1.0;
};

/// inv_freq for `params` with rotary dim `dim` (= head_dim * partial_rotary_factor), like
/// transformers' ROPE_INIT_FUNCTIONS[type](config, device, seq_len). `seq_len` matters only for
/// "dynamic" (NTK base grows when seq_len > max_position_embeddings); nullopt = init time.
RopeInit compute_rope_init(const RopeParams& params, int64_t dim, int64_t max_position_embeddings,
                           std::optional<int64_t> seq_len = std::nullopt);

/// The rotary embedding module of a model (transformers' LlamaRotaryEmbedding), including the
/// stateful dynamic-NTK update of `dynamic_rope_update`: when max(position)+1 exceeds the cached
/// length, inv_freq is recomputed for that length and kept; when it falls back below the original
/// max_position_embeddings, the original inv_freq is restored.
class RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  RotaryEmbedding(RopeParams params, int64_t head_dim, int64_t max_position_embeddings, at::Device device);

  /// cos, sin [T, D] in `dtype` for absolute positions offset .. offset+T-1 (computed in fp32:
  /// freqs = inv_freq ⊗ positions, emb = cat(freqs, freqs), cos(emb)·scaling, then cast).
  std::pair<at::Tensor, at::Tensor> cos_sin(int64_t offset, int64_t T, at::ScalarType dtype);

  const at::Tensor& inv_freq() const { return inv_freq_; }
  double attention_scaling() const { return attention_scaling_; }
  int64_t dim() const { return dim_; }

 private:
  RopeParams params_;
  int64_t dim_ = 0;
  int64_t max_pos_ = 0;
  at::Device device_ = at::kCPU;
  at::Tensor inv_freq_, original_inv_freq_;
  double attention_scaling_ = 1.0;
  int64_t max_seq_len_cached_ = 0;
};

/// transformers' rotate_half: x = [x1, x2] halves on the last dim → [-x2, x1].
at::Tensor rotate_half(const at::Tensor& x);

/// q·cos + rotate_half(q)·sin for q [B, H, T, D] and cos/sin [T, D] (broadcast over B, H).
/// Partial rotary (cos.size(-1) < D) rotates the first cos.size(-1) dims and passes the rest.
/// While autograd records on x, the rotation runs as nn::rotary_lean (nn/lean_grad.h): the same
/// values bit for bit, fewer [.., T, D] temporaries in the forward and the backward. On CUDA
/// without autograd (and the fused kernels on) one kernel computes the same bits (nn::fused_rotary).
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace hearth::nn
