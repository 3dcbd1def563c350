// Gemma4Config: the typed config.json of the Gemma 4 family (model_type gemma4_text, and gemma4 —
// the multimodal wrapper whose text model is under text_config). Not the weights, the
// quantization block (io/hf_config.h) or the vision/audio towers (not loaded).
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace hearth::models::gemma4 {

/// RoPE of one layer type, as transformers' Gemma4TextRotaryEmbedding reads
/// rope_parameters[layer_type]: "default" (every pair of the layer's head dim rotates, base
/// theta) or "proportional" (only the first floor(partial_rotary_factor·D/2) frequencies rotate,
/// inv_freq = 1/theta^(2i/D) / factor; the rest are zero).
struct Gemma4Rope {
  std::string type = "default";
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  double factor = 1.0;
};

struct Gemma4Config {
  std::string model_type;   // "gemma4_text" or "gemma4"
  bool wrapped = false;     // model_type gemma4: the text model sits under text_config
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 4;
  int64_t head_dim = 256;
  int64_t global_head_dim = 512;                       // head dim of full-attention layers
  std::optional<int64_t> num_global_key_value_heads;   // KV heads of full layers with attention_k_eq_v
  bool attention_k_eq_v = false;
  bool attention_bias = false;
  int64_t num_kv_shared_layers = 0;
  bool use_double_wide_mlp = false;
  int64_t hidden_size_per_layer_input = 256;           // 0: no per-layer inputs
  int64_t vocab_size_per_layer_input = 262144;
  double rms_norm_eps = 1e-6;
  int64_t sliding_window = 512;
  int64_t max_position_embeddings = 131072;
  std::optional<double> final_logit_softcapping;
  bool tie_word_embeddings = true;
  std::vector<bool> sliding;                           // per layer: sliding_attention (else full)
  Gemma4Rope sliding_rope, full_rope;

  // Derived per layer (Gemma4TextAttention / Gemma4TextMLP constructors).
  int64_t first_kv_shared_layer() const { return num_hidden_layers - num_kv_shared_layers; }
  bool kv_shared(int64_t layer) const { return layer >= first_kv_shared_layer(); }
  /// The layer whose K/V layer `layer` attends with: itself, or for a sharer the last layer
  /// before first_kv_shared_layer() of the same type.
  int64_t kv_source(int64_t layer) const { return kv_source_[layer]; }
  /// Whether `layer` is the last non-shared layer of its type (it hands its K/V to sharers).
  bool kv_donor(int64_t layer) const;
  /// Head dim and KV heads of `layer`: per_layer_config's override when config.json has one
  /// (transformers 5.17 writes it), else global_head_dim for full layers and, with
  /// attention_k_eq_v, num_global_key_value_heads (Gemma4TextConfig.__post_init__).
  int64_t layer_head_dim(int64_t layer) const { return layer_head_dim_[layer]; }
  int64_t layer_kv_heads(int64_t layer) const { return layer_kv_heads_[layer]; }
  bool k_eq_v(int64_t layer) const { return attention_k_eq_v && !sliding[layer]; }
  int64_t layer_intermediate(int64_t layer) const {
    const int64_t first = first_kv_shared_layer();
    return intermediate_size * (use_double_wide_mlp && layer >= first && first > 0 ? 2 : 1);
  }
  const Gemma4Rope& rope(int64_t layer) const { return sliding[layer] ? sliding_rope : full_rope; }
  static const char* type_name(bool is_sliding) { return is_sliding ? "sliding_attention" : "full_attention"; }

  /// Parses config.json (`origin` names the file in errors; fields of the wrapper's text model
  /// are named "text_config.<key>"). Follows transformers' Gemma4TextConfig defaults (last layer
  /// forced to full_attention as its __post_init__ does). Throws hearth::Error with one line naming
  /// the file and field when: a required key (vocab_size, hidden_size, intermediate_size,
  /// num_hidden_layers, num_attention_heads) is missing or not a positive integer; layer_types'
  /// length differs from num_hidden_layers or holds another type; num_kv_shared_layers leaves a
  /// sharer without an earlier layer of its type; sliding_window <= 0; a rope type other than
  /// default/proportional; enable_moe_block is true (the MoE block is not supported);
  /// hidden_activation is not gelu_pytorch_tanh; use_bidirectional_attention is "all";
  /// per_layer_config names a layer out of range, a key other than head_dim/num_key_value_heads,
  /// or gives layers of one type different head dims.
  static Gemma4Config from_json(const nlohmann::json& config, const std::string& origin);

 private:
  std::vector<int64_t> kv_source_;
  std::vector<int64_t> layer_head_dim_, layer_kv_heads_;
};

}  // namespace hearth::models::gemma4
