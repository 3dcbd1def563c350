// The llama family (llama, mistral, qwen2, qwen3): transformers' modeling_llama.py in C++, same
// module names and op order. Family differences (biases, q/k norm, sliding windows, RoPE
// scaling) come from LlamaConfig; quantization and adapters live in nn::Linear, not here.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "models/llama/config.h"
#include "cache/static_kv_cache.h"
#include "models/model.h"
#include "models/registry.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/rms_norm.h"
#include "nn/rope.h"
#include "nn/quant_config.h"

namespace hearth::models::llama {

/// One row group of a forward (models::row_groups) with what its attention needs: its RoPE tables
/// cos/sin [T, D] at `offset` and its KV cache (may be null).
struct AttentionRows {
  RowGroup rows;
  at::Tensor cos, sin;
  cache::KVCacheBase* cache = nullptr;
  /// A static decode step (cache::StaticKVCache): additive masks [B, 1, 1, S] from the device
  /// positions, for full and sliding-window layers (undefined otherwise).
  at::Tensor mask_full, mask_window;
};

/// LlamaAttention: q/k/v projections, optional per-head q/k RMSNorm (qwen3), RoPE, cache, GQA
/// attention, o_proj.
struct LlamaAttention {
  nn::Linear q_proj, k_proj, v_proj, o_proj;
  std::optional<nn::RMSNorm> q_norm, k_norm;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  double scaling = 1.0;
  std::optional<int64_t> sliding_window;
  nn::AttentionBackend backend = nn::AttentionBackend::kAuto;

  /// x [B, T, C] → [B, T, C]. The projections run on all B rows at once; RoPE, the cache and the
  /// attention per row group (one group = the whole batch at one position).
  at::Tensor forward(const at::Tensor& x, const std::vector<AttentionRows>& groups) const;
  /// forward() after its projections: qkv = {q [B, T, H·D], k [B, T, Hkv·D], v [B, T, Hkv·D]} (the
  /// q/k/v products of x, as the decoder layer computes them with its norm fused in).
  at::Tensor forward_projected(const std::vector<at::Tensor>& qkv, const std::vector<AttentionRows>& groups) const;
  /// One decode token for each of B rows, each with its own position and cache (groups[b] = row b):
  /// q [B, H, 1, D], k/v [B, Hkv, 1, D] (before RoPE) → [B, H, 1, D]. RoPE and the attention run once
  /// over a padded batch of the rows' keys (a mask hides each row's padding), not once per row.
  at::Tensor decode_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::vector<AttentionRows>& groups) const;
};

struct LlamaDecoderLayer {
  nn::RMSNorm input_layernorm, post_attention_layernorm;
  LlamaAttention self_attn;
  nn::GatedMLP mlp;
  /// x [B, T, C] → [B, T, C] (LlamaDecoderLayer.forward): forward_unadded's sum + delta.
  at::Tensor forward(const at::Tensor& x, const std::vector<AttentionRows>& groups) const;
  /// The layer with its last residual add left to the caller (vLLM's residual passing): returns
  /// {sum, delta}, the layer's output being sum + delta ([B, T, C] each). `pending`, when defined,
  /// is the previous layer's delta not yet added to x: the input norm adds it in its own kernel
  /// (nn::RMSNorm::forward_add), so consecutive layers skip one elementwise launch each. The same
  /// values as adding first (an addition rounds the same in either order). On the decode path a norm
  /// runs inside the GEMV launch after it where nn::Linear::forward_many_normed fuses it (the 1B's
  /// q/k/v; not its gate/up, past nn::kGemvNormMaxRows).
  std::pair<at::Tensor, at::Tensor> forward_unadded(const at::Tensor& x, const at::Tensor& pending,
                                                    const std::vector<AttentionRows>& groups) const;
};

class LlamaModel : public Model {
 public:
  /// Builds from `weights` (HF names: model.embed_tokens, model.layers.N.*, model.norm, lm_head);
  /// `quant_spec(path)` gives the MLX quantization spec of a module (nullopt = dense).
  LlamaModel(LlamaConfig config, const nn::ParamSource& weights, const std::optional<nn::QuantizationConfig>& quant,
             const nn::LoadOptions& placement);

  Boundary embed(const at::Tensor& input_ids) override;
  /// Takes ragged batches (rows at their own positions through a cache::rows_view).
  Boundary forward_layers(const Boundary& in, int64_t begin, int64_t end, const Positions& pos,
                          cache::Caches* caches) override;
  at::Tensor head(const at::Tensor& hidden) override;
  cache::Caches make_cache() const override;
  bool ragged_batches() const override { return true; }

  const std::string& model_type() const override { return config_.model_type; }
  int64_t num_layers() const override { return config_.num_hidden_layers; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t hidden_size() const override { return config_.hidden_size; }
  const nn::LoadOptions& placement() const override { return placement_; }
  int64_t weight_bytes() const override;
  std::vector<std::pair<std::string, nn::Linear*>> linear_modules() override;
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override;

  const LlamaConfig& config() const { return config_; }
  std::vector<LlamaDecoderLayer>& layers() { return layers_; }
  /// Chooses the attention path of every layer (tests compare plain and SDPA).
  void set_attention_backend(nn::AttentionBackend backend);

 private:
  // The one-token step over static caches (cache/static_kv_cache.h): positions, RoPE rows and
  // masks come from device tensors only, so the step can be captured in a CUDA graph.
  Boundary forward_static(const Boundary& in, int64_t begin, int64_t end, cache::StaticState& st,
                          cache::Caches& caches);

  LlamaConfig config_;
  nn::LoadOptions placement_;
  nn::Embedding embed_tokens_;
  std::vector<LlamaDecoderLayer> layers_;
  nn::RMSNorm norm_;
  nn::Linear lm_head_;
  nn::RotaryEmbedding rotary_emb_;
};

/// The registry factory for llama, mistral, qwen2 and qwen3.
std::unique_ptr<Model> create(const BuildArgs& args);
/// Validates config.json for this family (LlamaConfig::from_json) without building anything.
void check_config(const nlohmann::json& config, const std::string& origin);

}  // namespace hearth::models::llama
