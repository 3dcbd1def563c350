// LlamaConfig::from_json, with the per-model_type defaults of transformers' config classes.
#include "models/llama/config.h"

#include <cmath>

#include "core/error.h"

namespace hearth::models::llama {

namespace {
using nlohmann::json;

int64_t req_int(const json& j, const char* key, const std::string& origin) {
  auto it = j.find(key);
  HEARTH_CHECK(it != j.end() && !it->is_null(), origin, ": missing required key '", key, "'");
  HEARTH_CHECK(it->is_number_integer() && it->get<int64_t>() > 0, origin, ": '", key,
               "' must be a positive integer, got ", it->dump());
  return it->get<int64_t>();
}

// An optional positive integer (absent or null -> fallback). A float such as 2.5, a string or a
// value <= 0 is an error naming the key (nlohmann would truncate 2.5 or throw its own text).
int64_t opt_pos_int(const json& j, const char* key, int64_t fallback, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  HEARTH_CHECK(it->is_number_integer() && it->get<int64_t>() > 0, origin, ": '", key,
               "' must be a positive integer, got ", it->dump());
  return it->get<int64_t>();
}

template <typename T>
T opt(const json& j, const char* key, T fallback, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw Error(cat(origin, ": '", key, "' has the wrong type (", it->dump(), ")"));
  }
}
}  // namespace

LlamaConfig LlamaConfig::from_json(const json& j, const std::string& origin) {
  HEARTH_CHECK(j.is_object(), origin, ": config must be a JSON object");
  LlamaConfig c;
  c.model_type = opt<std::string>(j, "model_type", "llama", origin);
  const std::string& mt = c.model_type;
  HEARTH_CHECK(mt == "llama" || mt == "mistral" || mt == "qwen2" || mt == "qwen3", origin, ": model_type '", mt,
               "' is not a llama-family type (llama, mistral, qwen2, qwen3)");
  c.vocab_size = req_int(j, "vocab_size", origin);
  c.hidden_size = req_int(j, "hidden_size", origin);
  c.intermediate_size = req_int(j, "intermediate_size", origin);
  c.num_hidden_layers = req_int(j, "num_hidden_layers", origin);
  HEARTH_CHECK(c.num_hidden_layers >= 1 && c.num_hidden_layers <= 4096, origin, ": num_hidden_layers must be in 1..4096, got ",
               c.num_hidden_layers);
  c.num_attention_heads = req_int(j, "num_attention_heads", origin);
  c.num_key_value_heads = opt_pos_int(j, "num_key_value_heads", c.num_attention_heads, origin);
  HEARTH_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0, origin,
               ": num_attention_heads (", c.num_attention_heads, ") must be a multiple of num_key_value_heads (",
               c.num_key_value_heads, ")");
  c.head_dim = opt_pos_int(j, "head_dim", 0, origin);  // 0: not given
  if (c.head_dim == 0) {
    HEARTH_CHECK(c.hidden_size % c.num_attention_heads == 0, origin, ": hidden_size ", c.hidden_size,
                 " is not divisible by num_attention_heads ", c.num_attention_heads, " and head_dim is not given");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (auto it = j.find("rms_norm_eps"); it != j.end() && !it->is_null()) {
    HEARTH_CHECK(it->is_number() && std::isfinite(it->get<double>()) && it->get<double>() > 0, origin,
                 ": 'rms_norm_eps' must be a number > 0, got ", it->dump());
    c.rms_norm_eps = it->get<double>();
  }
  // The MLP is SwiGLU (silu); transformers' ACT2FN also names it "swish". Another activation
  // would run as silu, a silent wrong answer.
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null())
    HEARTH_CHECK(it->is_string() && (it->get<std::string>() == "silu" || it->get<std::string>() == "swish"), origin,
                 ": hidden_act ", it->dump(), " is not supported (silu only)");
  c.tie_word_embeddings = opt<bool>(j, "tie_word_embeddings", false, origin);
  c.max_position_embeddings =
      opt_pos_int(j, "max_position_embeddings", mt == "mistral" ? 4096 * 32 : mt == "llama" ? 2048 : 32768, origin);
  c.mlp_bias = mt == "llama" ? opt<bool>(j, "mlp_bias", false, origin) : false;

  if (mt == "llama") {
    c.qkv_bias = c.o_bias = opt<bool>(j, "attention_bias", false, origin);
  } else if (mt == "qwen2") {
    c.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o_proj without
  } else if (mt == "qwen3") {
    c.qkv_bias = c.o_bias = opt<bool>(j, "attention_bias", false, origin);
    c.qk_norm = true;
  }

  // Sliding windows per layer (transformers: MistralConfig defaults sliding_window to 4096 and
  // applies it to every layer; Qwen2/Qwen3 only with use_sliding_window, on the layers named
  // sliding_attention by layer_types, by default those >= max_window_layers; llama: none).
  c.layer_windows.assign(c.num_hidden_layers, std::nullopt);
  std::optional<int64_t> window;
  const bool qwen = mt == "qwen2" || mt == "qwen3";
  if (mt == "mistral" || (qwen && opt<bool>(j, "use_sliding_window", false, origin))) {
    auto it = j.find("sliding_window");
    if (it == j.end()) window = 4096;
    else if (!it->is_null()) {
      HEARTH_CHECK(it->is_number_integer() && it->get<int64_t>() > 0, origin,
                   ": 'sliding_window' must be a positive integer or null, got ", it->dump());
      window = it->get<int64_t>();
    }
  }
  if (window) {
    if (auto it = j.find("layer_types"); qwen && it != j.end() && it->is_array()) {
      HEARTH_CHECK(static_cast<int64_t>(it->size()) == c.num_hidden_layers, origin, ": layer_types has ", it->size(),
                   " entries for ", c.num_hidden_layers, " layers");
      for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        const std::string t = (*it)[i].is_string() ? (*it)[i].get<std::string>() : "";
        HEARTH_CHECK(t == "full_attention" || t == "sliding_attention", origin, ": layer_types[", i, "] '", t,
                     "' is not full_attention or sliding_attention");
        if (t == "sliding_attention") c.layer_windows[i] = window;
      }
    } else if (qwen) {
      const int64_t max_window_layers = opt<int64_t>(j, "max_window_layers", 28, origin);
      HEARTH_CHECK(max_window_layers >= 0, origin, ": 'max_window_layers' must be >= 0, got ", max_window_layers);
      for (int64_t i = max_window_layers; i < c.num_hidden_layers; ++i) c.layer_windows[i] = window;
    } else {
      for (auto& w : c.layer_windows) w = window;
    }
  }

  c.rope = nn::RopeParams::from_json(j, origin);  // rope_theta defaults to 10000 for all four types
  const auto rotary = static_cast<int64_t>(static_cast<double>(c.head_dim) * c.rope.partial_rotary_factor);
  HEARTH_CHECK(rotary > 0 && rotary % 2 == 0, origin, ": the rotary dimension (head_dim ", c.head_dim,
               " x partial_rotary_factor ", c.rope.partial_rotary_factor, " = ", rotary, ") must be positive and even");
  return c;
}

}  // namespace hearth::models::llama
