// Gemma4Config::from_json with transformers' Gemma4TextConfig defaults (configuration_gemma4.py).
#include "models/gemma4/config.h"

#include <cmath>

#include "core/error.h"

namespace hearth::models::gemma4 {

namespace {
using nlohmann::json;

// Reads keys of one JSON object; `where` is "<file>: " plus "text_config." for the wrapper.
struct Reader {
  const json& j;
  std::string where;

  std::string name(const char* key) const { return where + key; }
  const json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t req_int(const char* key) const {
    const json* v = find(key);
    HEARTH_CHECK(v, name(key), ": missing required key");
    HEARTH_CHECK(v->is_number_integer() && v->get<int64_t>() > 0, name(key), ": must be a positive integer, got ",
                 v->dump());
    return v->get<int64_t>();
  }
  // An optional integer >= `min` (absent or null -> fallback).
  int64_t opt_int(const char* key, int64_t fallback, int64_t min = 1) const {
    const json* v = find(key);
    if (!v) return fallback;
    HEARTH_CHECK(v->is_number_integer() && v->get<int64_t>() >= min, name(key), ": must be an integer >= ", min,
                 ", got ", v->dump());
    return v->get<int64_t>();
  }
  bool opt_bool(const char* key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    HEARTH_CHECK(v->is_boolean(), name(key), ": must be true or false, got ", v->dump());
    return v->get<bool>();
  }
  std::optional<double> opt_pos_num(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    HEARTH_CHECK(v->is_number() && std::isfinite(v->get<double>()) && v->get<double>() > 0, name(key),
                 ": must be a number > 0, got ", v->dump());
    return v->get<double>();
  }
};

Gemma4Rope read_rope(const json& params, const std::string& where, const Gemma4Rope& fallback) {
  HEARTH_CHECK(params.is_object(), where, ": must be an object, got ", params.dump());
  Reader r{params, where + "."};
  Gemma4Rope rope;
  rope.type = fallback.type;
  if (const json* t = r.find("rope_type")) {
    HEARTH_CHECK(t->is_string(), where, ".rope_type: must be a string, got ", t->dump());
    rope.type = t->get<std::string>();
  }
  HEARTH_CHECK(rope.type == "default" || rope.type == "proportional", where, ".rope_type: unsupported rope type '",
               rope.type, "' (Gemma 4 uses default and proportional)");
  rope.theta = r.opt_pos_num("rope_theta").value_or(fallback.theta);
  rope.partial_rotary_factor = r.opt_pos_num("partial_rotary_factor").value_or(1.0);
  HEARTH_CHECK(rope.partial_rotary_factor <= 1, where, ".partial_rotary_factor: must be in (0, 1], got ",
               rope.partial_rotary_factor);
  rope.factor = r.opt_pos_num("factor").value_or(1.0);
  return rope;
}

}  // namespace

bool Gemma4Config::kv_donor(int64_t layer) const {
  if (kv_shared(layer)) return false;
  for (int64_t i = first_kv_shared_layer(); i < num_hidden_layers; ++i)
    if (kv_source_[i] == layer) return true;
  return false;
}

Gemma4Config Gemma4Config::from_json(const json& root, const std::string& origin) {
  HEARTH_CHECK(root.is_object(), origin, ": config must be a JSON object");
  Gemma4Config c;
  auto mt = root.find("model_type");
  c.model_type = mt != root.end() && mt->is_string() ? mt->get<std::string>() : "";
  HEARTH_CHECK(c.model_type == "gemma4" || c.model_type == "gemma4_text", origin, ": model_type '", c.model_type,
               "' is not a Gemma 4 type (gemma4, gemma4_text)");
  c.wrapped = c.model_type == "gemma4";
  const json* text = &root;
  std::string where = origin + ": ";
  if (c.wrapped) {
    auto it = root.find("text_config");
    HEARTH_CHECK(it != root.end() && it->is_object(), origin, ": text_config: missing (model_type gemma4 keeps its ",
                 "language model's config there)");
    text = &*it;
    where += "text_config.";
  }
  const Reader r{*text, where};

  HEARTH_CHECK(!r.opt_bool("enable_moe_block", false), r.name("enable_moe_block"),
               ": is true, but the Gemma 4 mixture-of-experts block is not supported (dense models only)");
  if (const json* act = r.find("hidden_activation"))
    HEARTH_CHECK(act->is_string() && act->get<std::string>() == "gelu_pytorch_tanh", r.name("hidden_activation"),
                 ": only gelu_pytorch_tanh is supported, got ", act->dump());
  if (const json* bi = r.find("use_bidirectional_attention"))
    HEARTH_CHECK(bi->is_string() && bi->get<std::string>() == "vision", r.name("use_bidirectional_attention"),
                 ": only null or \"vision\" (causal text) is supported, got ", bi->dump());

  c.vocab_size = r.req_int("vocab_size");
  c.hidden_size = r.req_int("hidden_size");
  c.intermediate_size = r.req_int("intermediate_size");
  c.num_hidden_layers = r.req_int("num_hidden_layers");
  HEARTH_CHECK(c.num_hidden_layers <= 4096, r.name("num_hidden_layers"), ": must be at most 4096, got ",
               c.num_hidden_layers);
  c.num_attention_heads = r.req_int("num_attention_heads");
  c.num_key_value_heads = r.opt_int("num_key_value_heads", 4);
  c.head_dim = r.opt_int("head_dim", 256);
  c.global_head_dim = r.opt_int("global_head_dim", 512);
  if (r.find("num_global_key_value_heads")) c.num_global_key_value_heads = r.opt_int("num_global_key_value_heads", 1);
  c.attention_k_eq_v = r.opt_bool("attention_k_eq_v", false);
  c.attention_bias = r.opt_bool("attention_bias", false);
  c.num_kv_shared_layers = r.opt_int("num_kv_shared_layers", 0, 0);
  c.use_double_wide_mlp = r.opt_bool("use_double_wide_mlp", false);
  c.hidden_size_per_layer_input = r.opt_int("hidden_size_per_layer_input", 256, 0);
  c.vocab_size_per_layer_input = r.opt_int("vocab_size_per_layer_input", 262144);
  c.max_position_embeddings = r.opt_int("max_position_embeddings", 131072);
  c.tie_word_embeddings = Reader{root, origin + ": "}.opt_bool("tie_word_embeddings", true);
  if (auto eps = r.opt_pos_num("rms_norm_eps")) c.rms_norm_eps = *eps;
  c.final_logit_softcapping = r.opt_pos_num("final_logit_softcapping");
  if (const json* w = r.find("sliding_window"))
    HEARTH_CHECK(w->is_number_integer() && w->get<int64_t>() > 0, r.name("sliding_window"),
                 ": must be a positive integer, got ", w->dump());
  c.sliding_window = r.opt_int("sliding_window", 512);

  for (const auto& [key, kv] : {std::pair<const char*, int64_t>{"num_key_value_heads", c.num_key_value_heads},
                                {"num_global_key_value_heads", c.num_global_key_value_heads.value_or(1)}})
    HEARTH_CHECK(c.num_attention_heads % kv == 0, r.name(key), ": num_attention_heads (", c.num_attention_heads,
                 ") must be a multiple of it (", kv, ")");

  // layer_types: default 5 sliding : 1 full; the last layer is forced to full_attention.
  c.sliding.assign(c.num_hidden_layers, true);
  if (const json* lt = r.find("layer_types")) {
    HEARTH_CHECK(lt->is_array(), r.name("layer_types"), ": must be a list, got ", lt->dump());
    HEARTH_CHECK(static_cast<int64_t>(lt->size()) == c.num_hidden_layers, r.name("layer_types"), ": has ", lt->size(),
                 " entries for num_hidden_layers = ", c.num_hidden_layers);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string t = (*lt)[i].is_string() ? (*lt)[i].get<std::string>() : (*lt)[i].dump();
      HEARTH_CHECK(t == "sliding_attention" || t == "full_attention", r.name("layer_types"), "[", i, "]: '", t,
                   "' is not sliding_attention or full_attention");
      c.sliding[i] = t == "sliding_attention";
    }
  } else {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.sliding[i] = (i + 1) % 6 != 0;
  }
  c.sliding.back() = false;

  // rope_parameters: one entry per layer type.
  Gemma4Rope sliding_default, full_default;
  full_default.type = "proportional";
  full_default.theta = 1e6;
  full_default.partial_rotary_factor = 0.25;
  c.sliding_rope = sliding_default;
  c.full_rope = full_default;
  if (const json* rp = r.find("rope_parameters")) {
    HEARTH_CHECK(rp->is_object(), r.name("rope_parameters"), ": must be an object, got ", rp->dump());
    for (bool s : {true, false}) {
      bool used = false;
      for (bool layer_sliding : c.sliding) used |= layer_sliding == s;
      if (!used) continue;
      auto it = rp->find(type_name(s));
      HEARTH_CHECK(it != rp->end(), r.name("rope_parameters"), ": has no entry for ", type_name(s),
                   " (Gemma 4 keeps one per layer type)");
      (s ? c.sliding_rope : c.full_rope) =
          read_rope(*it, r.name("rope_parameters.") + type_name(s), s ? sliding_default : full_default);
    }
  }

  // KV sharing (Gemma4TextAttention): layers from first_kv_shared_layer() on use the K/V of the
  // last earlier layer of their own type.
  HEARTH_CHECK(c.num_kv_shared_layers < c.num_hidden_layers, r.name("num_kv_shared_layers"), ": ",
               c.num_kv_shared_layers, " leaves no layer computing its own K/V (num_hidden_layers = ",
               c.num_hidden_layers, ")");
  const int64_t first = c.first_kv_shared_layer();
  c.kv_source_.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    c.kv_source_[i] = i;
    if (i < first) continue;
    c.kv_source_[i] = -1;
    for (int64_t d = first - 1; d >= 0; --d)
      if (c.sliding[d] == c.sliding[i]) {
        c.kv_source_[i] = d;
        break;
      }
    HEARTH_CHECK(c.kv_source_[i] >= 0, r.name("num_kv_shared_layers"), ": layer ", i, " (", type_name(c.sliding[i]),
                 ") shares the K/V of an earlier ", type_name(c.sliding[i]),
                 " layer, but layers 0..", first - 1, " (see layer_types) have none");
  }
  // Per-layer head dim and KV heads: per_layer_config when given, else derived.
  c.layer_head_dim_.resize(c.num_hidden_layers);
  c.layer_kv_heads_.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    c.layer_head_dim_[i] = c.sliding[i] ? c.head_dim : c.global_head_dim;
    c.layer_kv_heads_[i] = c.k_eq_v(i) && c.num_global_key_value_heads ? *c.num_global_key_value_heads
                                                                       : c.num_key_value_heads;
  }
  if (const json* plc = r.find("per_layer_config")) {
    HEARTH_CHECK(plc->is_object(), r.name("per_layer_config"), ": must be an object, got ", plc->dump());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      c.layer_head_dim_[i] = c.head_dim;
      c.layer_kv_heads_[i] = c.num_key_value_heads;
    }
    for (const auto& [key, val] : plc->items()) {
      const std::string where_i = r.name("per_layer_config.") + key;
      int64_t i = -1;
      try {
        size_t used = 0;
        i = std::stoll(key, &used);
        if (used != key.size()) i = -1;
      } catch (const std::exception&) {
      }
      HEARTH_CHECK(i >= 0 && i < c.num_hidden_layers, where_i, ": not a layer index in 0..", c.num_hidden_layers - 1);
      HEARTH_CHECK(val.is_object(), where_i, ": must be an object, got ", val.dump());
      const Reader lr{val, where_i + "."};
      for (const auto& [k, v] : val.items())
        HEARTH_CHECK(k == "head_dim" || k == "num_key_value_heads", where_i, ".", k,
                     ": unsupported per-layer override (head_dim, num_key_value_heads)");
      c.layer_head_dim_[i] = lr.opt_int("head_dim", c.head_dim);
      c.layer_kv_heads_[i] = lr.opt_int("num_key_value_heads", c.num_key_value_heads);
      HEARTH_CHECK(c.num_attention_heads % c.layer_kv_heads_[i] == 0, where_i,
                   ".num_key_value_heads: num_attention_heads (", c.num_attention_heads, ") must be a multiple of it (",
                   c.layer_kv_heads_[i], ")");
    }
  }
  int64_t first_of_type[2] = {-1, -1};  // [0] full, [1] sliding
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    int64_t& j = first_of_type[c.sliding[i]];
    if (j < 0) j = i;
    HEARTH_CHECK(c.layer_head_dim_[j] == c.layer_head_dim_[i], r.name("per_layer_config"), ": layers ", j, " and ", i,
                 " (", type_name(c.sliding[i]), ") have head dims ", c.layer_head_dim_[j], " and ", c.layer_head_dim_[i],
                 "; one RoPE table per layer type needs one head dim");
    const int64_t D = c.layer_head_dim(i);
    HEARTH_CHECK(D % 2 == 0, r.name(c.sliding[i] ? "head_dim" : "global_head_dim"), ": must be even for RoPE, got ", D);
  }
  return c;
}

}  // namespace hearth::models::gemma4
