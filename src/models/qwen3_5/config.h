// Qwen3_5Config: the typed config.json of the Qwen3.5 gated-DeltaNet hybrid family (model_type
// qwen3_5 — the VLM wrapper, whose text_config is read —, qwen3_5_text, and qwen3_next with a
// dense MLP). Not the weights, their prefixes or the quantization block (qwen3_5.h, io/hf_config.h).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "nn/rope.h"

namespace hearth::models::qwen3_5 {

enum class LayerKind { kLinear, kFull };

struct Qwen3_5Config {
  std::string model_type;       // as written in config.json (qwen3_5, qwen3_5_text, qwen3_next)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  // Full attention.
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 256;       // transformers' Qwen3_5TextConfig default (not hidden / heads)
  bool attention_bias = false;
  // Gated DeltaNet.
  int64_t linear_num_key_heads = 16;
  int64_t linear_num_value_heads = 32;
  int64_t linear_key_head_dim = 128;
  int64_t linear_value_head_dim = 128;
  int64_t linear_conv_kernel_dim = 4;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 32768;
  std::vector<LayerKind> layer_types;  // one per layer
  nn::RopeParams rope;                 // partial_rotary_factor defaults to 0.25
  std::vector<int64_t> eos_token_ids;  // config eos_token_id (int or list), may be empty

  int64_t key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  /// in_proj_qkv's output = the conv channels: 2·key_dim + value_dim.
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  /// Rotated dims of a full-attention head: trunc(head_dim · partial_rotary_factor).
  int64_t rotary_dim() const;

  /// Parses config.json (`origin` names the file in errors; for qwen3_5 the fields are read from
  /// text_config and errors name "text_config.<field>"). Layer kinds: layer_types when present
  /// (length must equal num_hidden_layers; entries linear_attention | full_attention), else layer
  /// i is linear iff (i+1) % full_attention_interval != 0 (default interval 4), as transformers'
  /// Qwen3_5TextConfig. Throws hearth::Error "<origin>: <field> ..." (one line) when a required key
  /// (vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads; and
  /// linear_num_key_heads, linear_num_value_heads when a layer is linear) is missing or mistyped,
  /// when heads do not divide (num_attention_heads % num_key_value_heads, linear value heads %
  /// key heads), for hidden_act other than silu, and for a MoE qwen3_next (num_experts > 0 on a
  /// layer outside mlp_only_layers) or a MoE qwen3_5 (num_experts > 0).
  static Qwen3_5Config from_json(const nlohmann::json& config, const std::string& origin);
};

}  // namespace hearth::models::qwen3_5
