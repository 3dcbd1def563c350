// The model's longest context from config.json (vLLM's derivation) and the --context-length check.
// Not the server's context length itself (model_engine.cpp) and not RoPE (models/).
#include "server/context_limit.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core/error.h"

namespace hearth::server {

namespace {

std::string number_text(double v) {
  if (v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  std::string s = std::to_string(v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  return s;
}

std::string rope_type_of(const nlohmann::json& rp) {
  for (const char* k : {"rope_type", "type"})
    if (rp.contains(k) && rp[k].is_string()) return rp[k].get<std::string>();
  return "default";
}

}  // namespace

ContextLimit derive_context_limit(const nlohmann::json& config) {
  ContextLimit out;
  if (!config.is_object()) return out;
  const nlohmann::json& c =
      config.contains("text_config") && config["text_config"].is_object() ? config["text_config"] : config;
  double derived = std::numeric_limits<double>::infinity();
  std::string key;
  for (const char* k : {"max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                        "max_seq_length", "seq_len"}) {
    if (c.contains(k) && c[k].is_number() && c[k].get<double>() > 0 && c[k].get<double>() < derived) {
      derived = c[k].get<double>();
      key = k;
    }
  }
  if (!std::isfinite(derived)) return out;
  out.explanation = key + " " + number_text(derived);

  std::string model_type;
  for (const nlohmann::json* m : {&c, &config})
    if (model_type.empty() && m->contains("model_type") && (*m)["model_type"].is_string())
      model_type = (*m)["model_type"].get<std::string>();
  const char* rope_key = c.contains("rope_scaling") && c["rope_scaling"].is_object()         ? "rope_scaling"
                         : c.contains("rope_parameters") && c["rope_parameters"].is_object() ? "rope_parameters"
                                                                                              : nullptr;
  if (rope_key && model_type.rfind("gemma", 0) != 0) {
    const nlohmann::json& rope = c[rope_key];
    // Transformers 5.x may nest one object per layer type ({"full_attention": {...}, ...}).
    bool nested = !rope.empty();
    for (const auto& [_, v] : rope.items()) nested = nested && v.is_object();
    std::vector<const nlohmann::json*> params;
    if (nested)
      for (const auto& [_, v] : rope.items()) params.push_back(&v);
    else
      params.push_back(&rope);
    double factor = 1.0;
    std::string how;
    for (const nlohmann::json* rp : params) {
      const std::string type = rope_type_of(*rp);
      if (type == "default" || type == "su" || type == "longrope" || type == "llama3") continue;
      if (rp->contains("factor") && (*rp)["factor"].is_number() && (*rp)["factor"].get<double>() > 0)
        factor = (*rp)["factor"].get<double>();
      how = std::string(rope_key) + " " + type + ": ";
      if (type == "yarn" && rp->contains("original_max_position_embeddings") &&
          (*rp)["original_max_position_embeddings"].is_number() && (*rp)["original_max_position_embeddings"].get<double>() > 0) {
        derived = (*rp)["original_max_position_embeddings"].get<double>();
        how += "original_max_position_embeddings " + number_text(derived);
      } else {
        how += key + " " + number_text(derived);
      }
    }
    if (!how.empty() && factor != 1.0) {
      derived *= factor;
      out.explanation = how + " x factor " + number_text(factor);
    }
  }
  out.tokens = derived >= 9e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(derived);
  return out;
}

std::string context_length_error(int64_t requested, const ContextLimit& limit, bool allow_longer) {
  if (requested <= 0 || limit.tokens <= 0 || requested <= limit.tokens || allow_longer) return "";
  return cat("--context-length (--max-model-len) ", requested, " is above the model's maximum context of ", limit.tokens,
             " tokens (config.json: ", limit.explanation,
             "); positions past it were never trained and give wrong output. Use --context-length ", limit.tokens,
             " or less, or pass --allow-long-context (or set HEARTH_ALLOW_LONG_CONTEXT=1) to use it anyway");
}

bool long_context_allowed_by_env() {
  const char* v = std::getenv("HEARTH_ALLOW_LONG_CONTEXT");
  if (!v) return false;
  const std::string s(v);
  return s == "1" || s == "true" || s == "TRUE" || s == "True";
}

}  // namespace hearth::server
