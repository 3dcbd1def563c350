// The Gemma 4 text model (model_type gemma4_text, and the language model of gemma4): transformers'
// modeling_gemma4.py (Gemma4TextAttention, Gemma4TextDecoderLayer, Gemma4TextModel,
// Gemma4ForCausalLM) in C++, same module names and op order, plus a one-token static decode step
// over cache::StaticKVCache (CUDA-graph capturable). Dense MLP only; no vision or audio towers
// (their weights are ignored). Quantization and adapters live in nn::Linear, not here.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <vector>

#include "cache/static_kv_cache.h"
#include "models/gemma4/config.h"
#include "models/model.h"
#include "models/registry.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/quant_config.h"

namespace hearth::models::gemma4 {

/// Gemma4RMSNorm: x · (mean(x²) + eps)^-0.5 in fp32, times the weight in fp32 (no 1 + w offset),
/// cast back to x's dtype; with_scale = false (v_norm) has no weight.
struct Gemma4RMSNorm {
  std::optional<at::Tensor> weight;
  double eps = 1e-6;
  /// x [..., dim] → same shape and dtype. For inference on CUDA, one fused kernel
  /// (nn::fused_rms_norm, within one rounding of these ops); while autograd records (lean path
  /// on), nn::rms_norm_lean_fp32w (nn/lean_grad.h): these ops' values, no fp32 copy of x kept;
  /// the ops otherwise.
  at::Tensor forward(const at::Tensor& x) const;
  /// residual + forward(x) (the sandwich norms' residual add), fused the same way.
  at::Tensor forward_add(const at::Tensor& x, const at::Tensor& residual) const;
};

/// The RoPE tables of one layer type (Gemma4TextRotaryEmbedding): inv_freq [D/2] float32.
struct Gemma4Rotary {
  at::Tensor inv_freq;
  /// cos, sin [T, D] in `dtype` on inv_freq's device for positions offset .. offset+T-1
  /// (freqs = inv_freq ⊗ positions in fp32, emb = cat(freqs, freqs)).
  std::pair<at::Tensor, at::Tensor> cos_sin(int64_t offset, int64_t T, at::ScalarType dtype) const;
  /// The same for positions held in a tensor: positions [N] int64 on inv_freq's device → cos, sin
  /// [N, D] (device ops only: a static step computes its rows from StaticState::positions).
  std::pair<at::Tensor, at::Tensor> cos_sin_at(const at::Tensor& positions, at::ScalarType dtype) const;
};

/// The K/V a layer attends with: keys/values [B, Hkv, S, D], keys[:, :, 0] at absolute position pos0.
struct SharedKV {
  at::Tensor k, v;
  int64_t pos0 = 0;
};

/// Gemma4TextAttention. A KV-sharing layer has no k/v projections or norms and attends with its
/// donor's K/V (`shared`); every other layer computes its own (v = the raw k projection with
/// attention_k_eq_v) and returns them through `own` for its sharers.
struct Gemma4Attention {
  nn::Linear q_proj, k_proj, v_proj, o_proj;
  bool has_kv = true, has_v_proj = true;
  Gemma4RMSNorm q_norm, k_norm, v_norm;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::optional<int64_t> sliding_window;
  nn::AttentionBackend backend = nn::AttentionBackend::kAuto;

  /// x [B, T, C], cos/sin [T, D] at positions offset.. → [B, T, C]. `cache` (may be null) takes
  /// this layer's new K/V; a sharer passes `shared` instead. `own` (if not null) receives the K/V
  /// this layer attended with.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset,
                     cache::KVCacheBase* cache, const SharedKV* shared, SharedKV* own) const;
  /// One decode token per row over static caches: x [B, 1, C], cos/sin [B, 1, 1, D] (each row's
  /// RoPE row), mask [B, 1, 1, S] additive over the capacity S (StaticState's full or window
  /// mask) → [B, 1, C]. A layer with its own K/V writes them into `cache` at the state's device
  /// positions and attends over its buffers; a sharer passes cache = null and `shared` = its
  /// donor's cache (this step's token already written). Same projections, norms, RoPE and scale 1
  /// as forward(); the attention reads the whole capacity under the mask (another summation order).
  at::Tensor forward_static(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                            cache::StaticKVCache* cache, const cache::StaticKVCache* shared) const;

 private:
  // q [B, H, T, D] after q_norm and RoPE; k/v [B, Hkv, T, D] (k after k_norm and RoPE, v after v_norm).
  at::Tensor query(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const;
  std::pair<at::Tensor, at::Tensor> key_value(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const;
  // attention(q, k, v, p) then o_proj: [B, H, T, D] → [B, T, C].
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, nn::AttentionParams p) const;
};

/// Gemma4TextMLP: down_proj(gelu_tanh(gate_proj(x)) · up_proj(x)).
struct Gemma4MLP {
  nn::Linear gate_proj, up_proj, down_proj;
  at::Tensor forward(const at::Tensor& x) const;
};

/// Gemma4TextDecoderLayer (dense): sandwich norms around attention and MLP, the per-layer input
/// gate/projection when the model has per-layer inputs, then × layer_scalar.
struct Gemma4DecoderLayer {
  Gemma4RMSNorm input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm;
  Gemma4Attention self_attn;
  Gemma4MLP mlp;
  bool has_per_layer_input = false;
  nn::Linear per_layer_input_gate, per_layer_projection;
  Gemma4RMSNorm post_per_layer_input_norm;
  std::optional<at::Tensor> layer_scalar;  // [1]

  /// x [B, T, C]; per_layer_input [B, T, P] (undefined without per-layer inputs).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& per_layer_input, const at::Tensor& cos,
                     const at::Tensor& sin, int64_t offset, cache::KVCacheBase* cache, const SharedKV* shared,
                     SharedKV* own) const;
  /// The block around its attention: x [B, T, C] the layer input, attn [B, T, C] the attention
  /// output for input_layernorm(x) → the layer output (post-attention norm and residual, the MLP
  /// sandwich, the per-layer input, layer_scalar). forward() and the static step both end here.
  at::Tensor around_attention(const at::Tensor& x, const at::Tensor& attn, const at::Tensor& per_layer_input) const;
};

class Gemma4Model : public Model {
 public:
  /// Builds from `weights`: the text model under "model." (gemma4_text), "model.language_model."
  /// (gemma4, transformers) or "language_model.model." (gemma4, MLX), whichever holds
  /// embed_tokens; vision/audio tensors are not read. Throws hearth::Error naming the tensor when
  /// one is missing or has the wrong shape (a per-layer-input tensor, a non-sharer's k_proj, ...).
  Gemma4Model(Gemma4Config config, const nn::ParamSource& weights, const std::optional<nn::QuantizationConfig>& quant,
              const nn::LoadOptions& placement);

  /// hidden = embed_tokens(ids) · √hidden_size (the scale cast to the weight dtype first, as
  /// Gemma4TextScaledWordEmbedding); with per-layer inputs also the stream "per_layer_inputs"
  /// [B, T, L, P] = (norm(per_layer_model_projection(hidden) · hidden^-0.5) +
  /// embed_tokens_per_layer(ids) · √P) · 2^-0.5, an id at or past vocab_size_per_layer_input
  /// looking up row 0 there (mlx-lm's and vLLM's Gemma 4).
  Boundary embed(const at::Tensor& input_ids) override;
  /// Layers [begin, end). A KV donor (the last non-shared layer of a type that sharers read) sets
  /// the streams "shared_kv.<layer type>.k" / ".v" ([B, Hkv, S, D]) and ".pos0" (int64 scalar);
  /// a sharer reads them, so a range that starts after the donor needs them in `in` (throws
  /// hearth::Error otherwise). With caches the donor's K/V are what its cache returned. Rows must
  /// share one position (pos.common).
  /// Static caches (cache::StaticKVCache, the decode runner's: generate/graph_decode.cpp) take the
  /// static step instead: one token per row at StaticState::positions, RoPE rows and the full and
  /// window masks [B, 1, 1, capacity] built on the device once per step, sliding layers over
  /// full-capacity buffers under the window mask, sharers over their donor's static buffers (read
  /// from caches[kv_source], so no shared_kv streams are needed or set). Every op besides the
  /// attention's length is the eager path's; sets StaticState::family_ran_static.
  Boundary forward_layers(const Boundary& in, int64_t begin, int64_t end, const Positions& pos,
                          cache::Caches* caches) override;
  /// norm, tied lm_head, then tanh(logits / cap) · cap when final_logit_softcapping is set.
  at::Tensor head(const at::Tensor& hidden) override;
  /// RotatingKVCache(sliding_window) for sliding layers, KVCache for full ones, null for sharers.
  /// (The static decode runner turns each into a full-capacity StaticKVCache and back.)
  cache::Caches make_cache() const override;

  const std::string& model_type() const override { return config_.model_type; }
  int64_t num_layers() const override { return config_.num_hidden_layers; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t hidden_size() const override { return config_.hidden_size; }
  const nn::LoadOptions& placement() const override { return placement_; }
  int64_t weight_bytes() const override;
  /// Module paths as in the checkpoint ("<prefix>layers.3.self_attn.q_proj", ..., "lm_head").
  std::vector<std::pair<std::string, nn::Linear*>> linear_modules() override;
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override;

  const Gemma4Config& config() const { return config_; }
  /// The weight prefix of the text model ("model.", "model.language_model.", "language_model.model.").
  const std::string& prefix() const { return prefix_; }
  void set_attention_backend(nn::AttentionBackend backend);
  /// The decoder layers and the RoPE tables of one layer type (diagnosis and tests).
  std::vector<Gemma4DecoderLayer>& layers() { return layers_; }
  const Gemma4Rotary& rotary(bool sliding) const { return sliding ? sliding_rotary_ : full_rotary_; }

 private:
  // The static step (see forward_layers): caches holds every layer, static or null (sharers).
  Boundary forward_static(const Boundary& in, int64_t begin, int64_t end, cache::StaticState& st,
                          cache::Caches& caches);
  // The "per_layer_inputs" stream of `in` (undefined without per-layer inputs); throws when missing.
  at::Tensor per_layer_stream(const Boundary& in) const;

  Gemma4Config config_;
  nn::LoadOptions placement_;
  std::string prefix_;
  nn::Embedding embed_tokens_;
  nn::Embedding embed_tokens_per_layer_;
  nn::Linear per_layer_model_projection_;
  Gemma4RMSNorm per_layer_projection_norm_;
  std::vector<Gemma4DecoderLayer> layers_;
  Gemma4RMSNorm norm_;
  nn::Linear lm_head_;
  Gemma4Rotary sliding_rotary_, full_rotary_;
};

/// The registry factory for gemma4 and gemma4_text.
std::unique_ptr<Model> create(const BuildArgs& args);
/// Validates config.json for this family (Gemma4Config::from_json) without building anything.
void check_config(const nlohmann::json& config, const std::string& origin);

}  // namespace hearth::models::gemma4
