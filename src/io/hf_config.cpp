// Folder-level Hugging Face JSON: read_json with one-line errors, generation_config.json, and the
// MLX quantization block. Not family configs (those live in models/<family>/).
#include "io/hf_config.h"

#include "core/error.h"
#include "core/json_nesting.h"
#include "io/atomic_file.h"

namespace hearth::io {
namespace fs = std::filesystem;
using nlohmann::json;

nlohmann::json read_json(const fs::path& path) {
  const std::string text = read_file(path);
  check_json_nesting(text, path.string());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    std::string msg = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." -> drop the tag.
    if (auto p = msg.find("] "); p != std::string::npos && msg.rfind("[json.", 0) == 0) msg = msg.substr(p + 2);
    for (char& c : msg)
      if (c == '\n' || c == '\r') c = ' ';
    throw Error(cat(path.string(), ": invalid JSON (", msg, ")"));
  }
}

namespace {

std::optional<int64_t> opt_int(const json& j, const char* key, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  HEARTH_CHECK(it->is_number_integer(), origin, ": ", key, " must be an integer, got ", it->dump());
  return it->get<int64_t>();
}

std::optional<double> opt_num(const json& j, const char* key, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  HEARTH_CHECK(it->is_number(), origin, ": ", key, " must be a number, got ", it->dump());
  return it->get<double>();
}

}  // namespace

GenerationConfig GenerationConfig::load(const fs::path& dir) {
  GenerationConfig g;
  const fs::path path = dir / "generation_config.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) return g;
  const std::string origin = path.string();
  const json j = read_json(path);
  HEARTH_CHECK(j.is_object(), origin, ": not a JSON object");
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      g.eos_token_ids.push_back(it->get<int64_t>());
    } else {
      HEARTH_CHECK(it->is_array(), origin, ": eos_token_id must be an integer or a list of integers, got ",
                   it->dump());
      for (const auto& v : *it) {
        HEARTH_CHECK(v.is_number_integer(), origin, ": eos_token_id must be an integer or a list of integers, got ",
                     it->dump());
        g.eos_token_ids.push_back(v.get<int64_t>());
      }
    }
  }
  g.bos_token_id = opt_int(j, "bos_token_id", origin);
  g.top_k = opt_int(j, "top_k", origin);
  g.temperature = opt_num(j, "temperature", origin);
  g.top_p = opt_num(j, "top_p", origin);
  g.min_p = opt_num(j, "min_p", origin);
  g.repetition_penalty = opt_num(j, "repetition_penalty", origin);
  if (auto it = j.find("do_sample"); it != j.end() && !it->is_null()) {
    HEARTH_CHECK(it->is_boolean(), origin, ": do_sample must be true or false, got ", it->dump());
    g.do_sample = it->get<bool>();
  }
  return g;
}

std::optional<nn::QuantSpec> QuantizationConfig::spec_for(const std::string& path) const {
  auto it = overrides.find(path);
  if (it != overrides.end()) return it->second;
  return default_spec;
}

namespace {

// Reads {"group_size": .., "bits": ..} at `where`, missing keys taken from `fallback`.
nn::QuantSpec read_spec(const json& j, const std::string& where, const nn::QuantSpec* fallback) {
  nn::QuantSpec s = fallback ? *fallback : nn::QuantSpec{};
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
  nn::check_quant_spec(s, where);
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

}  // namespace hearth::io
