// LlamaConfig: the typed config.json of the llama family (model_type llama, mistral, qwen2,
// qwen3; MiniCPM5 ships as llama). Not the weights or the quantization block (io/hf_config.h).
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "nn/rope.h"

namespace hearth::models::llama {

struct LlamaConfig {
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // default: num_attention_heads
  int64_t head_dim = 0;             // default: hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;            // llama: attention_bias; qwen2: true
  bool o_bias = false;              // llama: attention_bias; qwen2/qwen3: false
  bool mlp_bias = false;
  bool qk_norm = false;             // qwen3: q_norm/k_norm RMSNorm over head_dim
  int64_t max_position_embeddings = 2048;
  /// Per layer: the sliding window of that layer, or nullopt for full attention.
  std::vector<std::optional<int64_t>> layer_windows;
  nn::RopeParams rope;

  /// Parses config.json (`origin` names the file in errors). Throws hearth::Error naming the key
  /// when a required key (vocab_size, hidden_size, intermediate_size, num_hidden_layers,
  /// num_attention_heads) is missing or has the wrong type, or a value is inconsistent. Follows
  /// the transformers defaults of each model_type (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config).
  static LlamaConfig from_json(const nlohmann::json& config, const std::string& origin);
};

}  // namespace hearth::models::llama
