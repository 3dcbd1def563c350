// The Qwen3.5 family (qwen3_5, qwen3_5_text, dense qwen3_next): transformers' modeling_qwen3_5.py
// in C++, same module names and op order — a hybrid of gated full attention and Gated DeltaNet
// linear attention. The gated delta rule and causal conv1d live in nn/gated_delta.h; quantization
// and adapters in nn::Linear. Not the chat format (thinking, tool calls) nor a prompt cache.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/recurrent_cache.h"
#include "cache/static_recurrent_cache.h"
#include "models/model.h"
#include "models/qwen3_5/config.h"
#include "models/registry.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/rope.h"
#include "nn/quant_config.h"

namespace hearth::models::qwen3_5 {

/// Qwen3_5RMSNorm: x_f32 · rsqrt(mean(x_f32²) + eps) · (offset + weight_f32), cast to x's dtype.
/// transformers stores zero-centred weights (offset 1); mlx-lm's converted checkpoints store
/// weight + 1 (offset 0). `weight` stays as stored, so a full fine-tune saves what it loaded.
struct ZeroCenteredRMSNorm {
  at::Tensor weight;  // [dim]
  double eps = 1e-6;
  double offset = 1.0;
  /// x [..., dim] → [..., dim]; for inference on CUDA one fused kernel (nn::fused_rms_norm,
  /// within one rounding of these ops); while autograd records (lean path on),
  /// nn::rms_norm_lean_fp32w (nn/lean_grad.h): these ops' values, no fp32 copy of x kept.
  at::Tensor forward(const at::Tensor& x) const;
};

/// Qwen3_5RMSNormGated: (weight · rmsnorm(h).to(h.dtype)) · silu(gate_f32), cast to h's dtype.
struct RMSNormGated {
  at::Tensor weight;  // [Dv]
  double eps = 1e-6;
  /// h, gate [N, Dv] → [N, Dv]; fused on CUDA for inference like ZeroCenteredRMSNorm; while
  /// autograd records (lean path on), nn::rms_norm_gated_lean (nn/lean_grad.h), the same values.
  at::Tensor forward(const at::Tensor& h, const at::Tensor& gate) const;
};

/// Qwen3_5Attention: q_proj → (queries, output gate), q/k ZeroCenteredRMSNorm over head_dim,
/// partial RoPE, KV cache, GQA softmax attention, o_proj(attn · sigmoid(gate)).
struct Attention {
  nn::Linear q_proj, k_proj, v_proj, o_proj;  // q_proj out = H · 2D (queries and gate per head)
  ZeroCenteredRMSNorm q_norm, k_norm;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  double scaling = 1.0;
  nn::AttentionBackend backend = nn::AttentionBackend::kAuto;
  /// x [B, T, C], cos/sin [T, rotary_dim] (a static step: [B, 1, 1, rotary_dim]) → [B, T, C];
  /// `cache` may be null. `mask`, when defined, is the additive mask [B, 1, T, S] over the keys the
  /// cache returns (a static step's; otherwise causal masking from the offsets).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset,
                     cache::KVCacheBase* cache, const at::Tensor& mask = at::Tensor()) const;
};

/// Qwen3_5GatedDeltaNet: projections, causal conv1d with state, L2-normalised q/k, the gated delta
/// rule (chunked for T > 1 or a fresh state, recurrent for one cached token — on CUDA one fused
/// kernel from mixed_qkv, nn::fused_gated_delta_step), RMSNormGated with z,
/// out_proj. qwen3_next's fused in_proj_qkvz / in_proj_ba (per key head: q, k, v-group, z-group)
/// are read in its own layout when `fused`.
struct GatedDeltaNet {
  bool fused = false;
  nn::Linear in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;  // Qwen3.5
  nn::Linear in_proj_qkvz, in_proj_ba;                      // qwen3_next (fused)
  nn::Linear out_proj;
  at::Tensor conv1d_weight;  // [convDim, 1, K] as transformers' conv1d.weight (MLX [convDim, K, 1] is moved)
  at::Tensor A_log, dt_bias;  // [Hv]
  RMSNormGated norm;
  int64_t num_k_heads = 0, num_v_heads = 0, head_k_dim = 0, head_v_dim = 0;
  int64_t key_dim() const { return num_k_heads * head_k_dim; }
  int64_t value_dim() const { return num_v_heads * head_v_dim; }
  /// x [B, T, C] → [B, T, C]; `cache` (may be null) holds conv_state [B, convDim, K-1] and the
  /// float32 recurrent state [B, Hv, Dk, Dv], both advanced by T tokens (a
  /// cache::StaticRecurrentCache is overwritten in place: a captured decode step).
  at::Tensor forward(const at::Tensor& x, cache::RecurrentCache* cache) const;
};

struct DecoderLayer {
  LayerKind kind = LayerKind::kLinear;
  ZeroCenteredRMSNorm input_layernorm, post_attention_layernorm;
  std::optional<Attention> self_attn;       // full-attention layers
  std::optional<GatedDeltaNet> linear_attn;  // linear-attention layers
  nn::GatedMLP mlp;
  /// The block's second half, as Qwen3_5DecoderLayer.forward: h = residual + the token mixer's
  /// output [B, T, C], then h + mlp(post_attention_layernorm(h)).
  at::Tensor mlp_residual(const at::Tensor& residual, const at::Tensor& mixed) const;
};

/// Where a checkpoint keeps the language model: "model." (qwen3_5_text, qwen3_next),
/// "model.language_model." (transformers' qwen3_5 wrapper) or "language_model.model." (mlx-lm's),
/// and its head ("lm_head" / "language_model.lm_head").
struct WeightLayout {
  std::string prefix = "model.";
  std::string head = "lm_head";
  bool mlx = false;  // conv1d stored [C, K, 1] and zero-centred norms stored as weight + 1
  /// The checkpoint's name of a text-model path: "model.layers.0.mlp.up_proj" → prefix +
  /// "layers.0.mlp.up_proj"; "lm_head…" → head + "…". Throws hearth::Error for another path.
  std::string name(const std::string& text_model_path) const;
};

class Qwen3_5Model : public Model {
 public:
  /// Builds from `weights` (names as WeightLayout finds them; vision tower and mtp.* tensors are
  /// ignored). Throws hearth::Error naming `origin` (config.json) and the field when the weights
  /// disagree with the config (layer count, conv1d shape).
  Qwen3_5Model(Qwen3_5Config config, const nn::ParamSource& weights,
               const std::optional<nn::QuantizationConfig>& quant, const nn::LoadOptions& placement,
               const std::string& origin);

  Boundary embed(const at::Tensor& input_ids) override;
  /// Takes ragged batches (rows at their own positions through a cache::rows_view): the token
  /// mixers run per row, the MLPs on all rows at once. With static caches (cache::StaticKVCache for
  /// full layers, cache::StaticRecurrentCache for linear ones: generate/graph_decode.cpp) one
  /// token per row at the device-held positions, graph-capturable.
  Boundary forward_layers(const Boundary& in, int64_t begin, int64_t end, const Positions& pos,
                          cache::Caches* caches) override;
  at::Tensor head(const at::Tensor& hidden) override;
  /// KVCache for full-attention layers, RecurrentCache for linear ones.
  cache::Caches make_cache() const override;
  bool ragged_batches() const override { return true; }
  /// The full-attention layers.
  std::vector<int64_t> isolated_layers() const override;

  const std::string& model_type() const override { return config_.model_type; }
  int64_t num_layers() const override { return config_.num_hidden_layers; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t hidden_size() const override { return config_.hidden_size; }
  const nn::LoadOptions& placement() const override { return placement_; }
  int64_t weight_bytes() const override;
  /// The checkpoint's own module paths (WeightLayout::name; as transformers and mlx-lm name the
  /// modules, so adapters and fused weights match their tools): model.layers.N.self_attn.
  /// {q,k,v,o}_proj, model.layers.N.linear_attn.{in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,
  /// out_proj} (qwen3_next: in_proj_qkvz, in_proj_ba), model.layers.N.mlp.{gate,up,down}_proj,
  /// lm_head, with "model." read as model.language_model. / language_model.model. (and
  /// language_model.lm_head) in the wrapped layouts.
  std::vector<std::pair<std::string, nn::Linear*>> linear_modules() override;
  /// The checkpoint's names (as linear_modules) and shapes (conv1d.weight [convDim, 1, K]; norms as stored: zero-centred
  /// for transformers checkpoints, +1 for MLX ones). Throws hearth::Error when a weight is quantized.
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override;

  const Qwen3_5Config& config() const { return config_; }
  const WeightLayout& layout() const { return layout_; }
  std::vector<DecoderLayer>& layers() { return layers_; }
  void set_attention_backend(nn::AttentionBackend backend);

 private:
  Qwen3_5Config config_;
  nn::LoadOptions placement_;
  WeightLayout layout_;
  nn::Embedding embed_tokens_;
  std::vector<DecoderLayer> layers_;
  ZeroCenteredRMSNorm norm_;
  nn::Linear lm_head_;
  nn::RotaryEmbedding rotary_emb_;

  // The one-token step over static caches: RoPE rows and masks from the device positions.
  Boundary forward_static(const Boundary& in, int64_t begin, int64_t end, cache::StaticState& st,
                          cache::Caches& caches);
};

/// Finds the WeightLayout of `weights` (see WeightLayout); throws hearth::Error naming `origin`
/// when no embed_tokens table is found under any known prefix.
WeightLayout detect_layout(const Qwen3_5Config& config, const nn::ParamSource& weights, bool quantized,
                           const std::string& origin);

/// The registry factory for qwen3_5, qwen3_5_text and qwen3_next.
std::unique_ptr<Model> create(const BuildArgs& args);
/// Validates config.json for this family (Qwen3_5Config::from_json) without building anything.
void check_config(const nlohmann::json& config, const std::string& origin);

}  // namespace hearth::models::qwen3_5
