// The MLX quantization block of config.json (quant_config.h): reading it with one-line errors,
// the per-module lookup across wrapped and unwrapped prefixes, and writing it back.
#include "nn/quant_config.h"

#include "core/error.h"

namespace hearth::nn {

using json = nlohmann::json;

namespace {

// Whether `longer` is `shorter` with one or more whole leading components before it
// ("language_model.model.x" vs "model.x").
bool ends_with_components(const std::string& longer, const std::string& shorter) {
  return longer.size() > shorter.size() && longer[longer.size() - shorter.size() - 1] == '.' &&
         longer.compare(longer.size() - shorter.size(), shorter.size(), shorter) == 0;
}

bool same_spec(const std::optional<QuantSpec>& a, const std::optional<QuantSpec>& b) {
  if (!a || !b) return !a && !b;
  return a->bits == b->bits && a->group_size == b->group_size;
}

}  // namespace

std::optional<QuantSpec> QuantizationConfig::spec_for(const std::string& path) const {
  auto it = overrides.find(path);
  if (it != overrides.end()) return it->second;
  // Overrides written under another prefix (a wrapped or unwrapped copy of the same model).
  const std::string* found = nullptr;
  const std::optional<QuantSpec>* spec = nullptr;
  for (const auto& [key, s] : overrides) {
    if (!ends_with_components(key, path) && !ends_with_components(path, key)) continue;
    if (found && !same_spec(*spec, s))
      throw Error(cat("quantization: module ", path, " matches two overrides with different settings, '", *found,
                      "' and '", key, "' (prefixes differ from the weights'; rename one)"));
    found = &key;
    spec = &s;
  }
  return spec ? *spec : std::optional<QuantSpec>(default_spec);
}

namespace {

// Reads {"group_size": .., "bits": ..} at `where`, missing keys taken from `fallback`.
QuantSpec read_spec(const json& j, const std::string& where, const QuantSpec* fallback) {
  QuantSpec s = fallback ? *fallback : QuantSpec{};
  for (const char* key : {"group_size", "bits"}) {
    auto it = j.find(key);
    if (it == j.end()) {
      HEARTH_CHECK(fallback, where, ": missing '", key, "'");
      continue;
    }
    HEARTH_CHECK(it->is_number_integer(), where, ".", key, ": ", it->dump(), " is not an integer");
    const int64_t v = it->get<int64_t>();
    HEARTH_CHECK(v > 0 && v <= 4096, where, ".", key, ": ", v, " unsupported");
    (std::string(key) == "bits" ? s.bits : s.group_size) = static_cast<int>(v);
  }
  check_quant_spec(s, where);
  return s;
}

}  // namespace

std::optional<QuantizationConfig> QuantizationConfig::from_config(const json& config, const std::string& origin) {
  if (!config.is_object()) return std::nullopt;
  const char* key = "quantization";
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    key = "quantization_config";
    it = config.find(key);
    if (it == config.end() || it->is_null()) return std::nullopt;
    // Hugging Face quantizers (gptq, awq, bitsandbytes, fp8, ...) use this key with another shape.
    if (it->is_object() && it->contains("quant_method") && !it->contains("bits"))
      throw Error(cat(origin, ": quantization_config.quant_method ", (*it)["quant_method"].dump(),
                      " unsupported (Hearth reads MLX affine quantization only)"));
  }
  const std::string where = cat(origin, ": ", key);
  HEARTH_CHECK(it->is_object(), where, " is not an object");
  const json& q = *it;
  if (auto m = q.find("mode"); m != q.end() && !m->is_null()) {
    HEARTH_CHECK(m->is_string() && m->get<std::string>() == "affine", where, ".mode: ", m->dump(),
                 " unsupported (expected \"affine\")");
  }
  if (auto m = q.find("quant_method"); m != q.end() && m->is_string() && m->get<std::string>() != "mlx")
    throw Error(cat(where, ".quant_method: ", m->dump(), " unsupported (Hearth reads MLX affine quantization only)"));
  QuantizationConfig qc;
  qc.default_spec = read_spec(q, where, nullptr);
  for (auto e = q.begin(); e != q.end(); ++e) {
    const std::string& k = e.key();
    if (k == "group_size" || k == "bits" || k == "mode") continue;
    if (e.value().is_boolean() && !e.value().get<bool>()) {
      qc.overrides[k] = std::nullopt;
    } else if (e.value().is_object()) {
      qc.overrides[k] = read_spec(e.value(), cat(where, ".", k), &qc.default_spec);
    }
    // Other scalars (e.g. "quant_method": "mlx") carry no per-module meaning.
  }
  return qc;
}

nlohmann::json QuantizationConfig::to_json() const {
  json j = {{"group_size", default_spec.group_size}, {"bits", default_spec.bits}, {"mode", "affine"}};
  for (const auto& [path, spec] : overrides) {
    if (spec)
      j[path] = {{"group_size", spec->group_size}, {"bits", spec->bits}};
    else
      j[path] = false;
  }
  return j;
}

}  // namespace hearth::nn
