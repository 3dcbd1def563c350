// Qwen3_5Config::from_json, with the defaults of transformers' Qwen3_5TextConfig / Qwen3NextConfig.
#include "models/qwen3_5/config.h"

#include <cmath>

#include "core/error.h"

namespace hearth::models::qwen3_5 {

namespace {
using nlohmann::json;

int64_t req_int(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  HEARTH_CHECK(it != j.end() && !it->is_null(), where, ": missing required key '", key, "'");
  HEARTH_CHECK(it->is_number_integer() && it->get<int64_t>() > 0, where, ": '", key,
               "' must be a positive integer, got ", it->dump());
  return it->get<int64_t>();
}

int64_t opt_pos_int(const json& j, const char* key, int64_t fallback, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  HEARTH_CHECK(it->is_number_integer() && it->get<int64_t>() > 0, where, ": '", key,
               "' must be a positive integer, got ", it->dump());
  return it->get<int64_t>();
}

bool opt_bool(const json& j, const char* key, bool fallback, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  HEARTH_CHECK(it->is_boolean(), where, ": '", key, "' must be true or false, got ", it->dump());
  return it->get<bool>();
}

// The int-or-list eos_token_id.
std::vector<int64_t> eos_ids(const json& j, const std::string& where) {
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return {};
  std::vector<int64_t> out;
  auto one = [&](const json& v) {
    HEARTH_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, where,
                 ": 'eos_token_id' must be a token id or a list of them, got ", it->dump());
    out.push_back(v.get<int64_t>());
  };
  if (it->is_array())
    for (const auto& v : *it) one(v);
  else
    one(*it);
  return out;
}
}  // namespace

int64_t Qwen3_5Config::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
}

Qwen3_5Config Qwen3_5Config::from_json(const json& top, const std::string& origin) {
  HEARTH_CHECK(top.is_object(), origin, ": config must be a JSON object");
  Qwen3_5Config c;
  auto mt_it = top.find("model_type");
  HEARTH_CHECK(mt_it != top.end() && mt_it->is_string(), origin, ": missing 'model_type'");
  c.model_type = mt_it->get<std::string>();
  const std::string& mt = c.model_type;
  HEARTH_CHECK(mt == "qwen3_5" || mt == "qwen3_5_text" || mt == "qwen3_next", origin, ": model_type '", mt,
               "' is not a Qwen3.5-family type (qwen3_5, qwen3_5_text, qwen3_next)");
  // The VLM wrapper keeps the language model's fields under text_config.
  const json* jp = &top;
  std::string where = origin;
  if (mt == "qwen3_5") {
    auto it = top.find("text_config");
    HEARTH_CHECK(it != top.end() && it->is_object(), origin, ": model_type qwen3_5 needs a 'text_config' object");
    jp = &*it;
    where = origin + ": text_config";
  }
  const json& j = *jp;

  c.vocab_size = req_int(j, "vocab_size", where);
  c.hidden_size = req_int(j, "hidden_size", where);
  c.intermediate_size = req_int(j, "intermediate_size", where);
  c.num_hidden_layers = req_int(j, "num_hidden_layers", where);
  HEARTH_CHECK(c.num_hidden_layers <= 4096, where, ": num_hidden_layers must be in 1..4096, got ", c.num_hidden_layers);
  c.num_attention_heads = req_int(j, "num_attention_heads", where);
  c.num_key_value_heads = opt_pos_int(j, "num_key_value_heads", mt == "qwen3_next" ? 2 : 4, where);
  HEARTH_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, where, ": num_attention_heads (",
               c.num_attention_heads, ") must be a multiple of num_key_value_heads (", c.num_key_value_heads, ")");
  c.head_dim = opt_pos_int(j, "head_dim", 256, where);
  c.attention_bias = opt_bool(j, "attention_bias", false, where);
  if (auto it = j.find("rms_norm_eps"); it != j.end() && !it->is_null()) {
    HEARTH_CHECK(it->is_number() && std::isfinite(it->get<double>()) && it->get<double>() > 0, where,
                 ": 'rms_norm_eps' must be a number > 0, got ", it->dump());
    c.rms_norm_eps = it->get<double>();
  }
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null())
    HEARTH_CHECK(it->is_string() && it->get<std::string>() == "silu", where, ": hidden_act ", it->dump(),
                 " is not supported (silu only)");
  // A tied head: text_config's flag, else the wrapper's (transformers' get_text_config()).
  c.tie_word_embeddings = opt_bool(top, "tie_word_embeddings", false, origin);
  c.tie_word_embeddings = opt_bool(j, "tie_word_embeddings", c.tie_word_embeddings, where);
  c.max_position_embeddings = opt_pos_int(j, "max_position_embeddings", 32768, where);

  // Layer kinds: layer_types wins; else the full_attention_interval rule.
  c.layer_types.resize(c.num_hidden_layers);
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    HEARTH_CHECK(it->is_array(), where, ": layer_types must be a list");
    HEARTH_CHECK(static_cast<int64_t>(it->size()) == c.num_hidden_layers, where, ": layer_types has ", it->size(),
                 " entries for num_hidden_layers = ", c.num_hidden_layers);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const json& t = (*it)[i];
      const std::string s = t.is_string() ? t.get<std::string>() : t.dump();
      HEARTH_CHECK(s == "linear_attention" || s == "full_attention", where, ": layer_types[", i, "] '", s,
                   "' is not linear_attention or full_attention");
      c.layer_types[i] = s == "full_attention" ? LayerKind::kFull : LayerKind::kLinear;
    }
  } else {
    const int64_t interval = opt_pos_int(j, "full_attention_interval", 4, where);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      c.layer_types[i] = (i + 1) % interval != 0 ? LayerKind::kLinear : LayerKind::kFull;
  }
  bool any_linear = false;
  for (auto k : c.layer_types) any_linear |= k == LayerKind::kLinear;
  if (any_linear) {
    c.linear_num_key_heads = req_int(j, "linear_num_key_heads", where);
    c.linear_num_value_heads = req_int(j, "linear_num_value_heads", where);
  } else {
    c.linear_num_key_heads = opt_pos_int(j, "linear_num_key_heads", c.linear_num_key_heads, where);
    c.linear_num_value_heads = opt_pos_int(j, "linear_num_value_heads", c.linear_num_value_heads, where);
  }
  HEARTH_CHECK(c.linear_num_value_heads % c.linear_num_key_heads == 0, where, ": linear_num_value_heads (",
               c.linear_num_value_heads, ") must be a multiple of linear_num_key_heads (", c.linear_num_key_heads, ")");
  c.linear_key_head_dim = opt_pos_int(j, "linear_key_head_dim", 128, where);
  c.linear_value_head_dim = opt_pos_int(j, "linear_value_head_dim", 128, where);
  c.linear_conv_kernel_dim = opt_pos_int(j, "linear_conv_kernel_dim", 4, where);
  HEARTH_CHECK(c.linear_conv_kernel_dim <= 64, where, ": linear_conv_kernel_dim must be in 1..64, got ",
               c.linear_conv_kernel_dim);

  // Dense MLP only: a mixture-of-experts variant is refused by name.
  const int64_t experts_default = mt == "qwen3_next" ? 512 : 0;
  int64_t num_experts = experts_default;
  if (auto it = j.find("num_experts"); it != j.end() && !it->is_null()) {
    HEARTH_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0, where,
                 ": 'num_experts' must be an integer >= 0, got ", it->dump());
    num_experts = it->get<int64_t>();
  }
  if (num_experts > 0) {
    std::vector<bool> dense(c.num_hidden_layers, false);
    if (auto it = j.find("mlp_only_layers"); it != j.end() && it->is_array())
      for (const auto& v : *it)
        if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < c.num_hidden_layers)
          dense[v.get<int64_t>()] = true;
    const int64_t step = opt_pos_int(j, "decoder_sparse_step", 1, where);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      HEARTH_CHECK(dense[i] || (i + 1) % step != 0, where, ": num_experts = ", num_experts, " (",
                   j.contains("num_experts") ? "" : "the transformers default; ",
                   "layer ", i, " would be a mixture of experts): only the dense-MLP variant is supported");
  }

  c.rope = nn::RopeParams::from_json(j, where);
  // Qwen3_5TextConfig assigns partial_rotary_factor 0.25 when the config names none.
  bool named = j.contains("partial_rotary_factor");
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) named |= it->contains("partial_rotary_factor");
  if (auto it = j.find("rope_scaling"); it != j.end() && it->is_object()) named |= it->contains("partial_rotary_factor");
  if (!named) c.rope.partial_rotary_factor = 0.25;
  HEARTH_CHECK(c.rope.type == "default", where, ": rope type '", c.rope.type,
               "' is not supported for this family (default only)");
  const int64_t rd = c.rotary_dim();
  HEARTH_CHECK(rd > 0 && rd % 2 == 0 && rd <= c.head_dim, where, ": the rotary dimension (head_dim ", c.head_dim,
               " x partial_rotary_factor ", c.rope.partial_rotary_factor, " = ", rd, ") must be positive and even");
  c.eos_token_ids = eos_ids(j, where);
  if (c.eos_token_ids.empty()) c.eos_token_ids = eos_ids(top, origin);
  return c;
}

}  // namespace hearth::models::qwen3_5
