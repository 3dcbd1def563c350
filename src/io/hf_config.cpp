// Folder-level Hugging Face JSON: read_json with one-line errors, generation_config.json, and the
// MLX quantization block. Not family configs (those live in models/<family>/).
#include "io/hf_config.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/json_nesting.h"
#include "io/atomic_file.h"

namespace hearth::io {
namespace fs = std::filesystem;
using nlohmann::json;

std::string json_error_text(const std::exception& e) {
  std::string msg = e.what();
  // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." -> drop the tag.
  if (auto p = msg.find("] "); p != std::string::npos && msg.rfind("[json.", 0) == 0) msg = msg.substr(p + 2);
  // "...; last read: 'ro'" quotes the input: a file outside what the caller may see must not leak.
  if (auto p = msg.find("; last read:"); p != std::string::npos) msg.resize(p);
  for (char& c : msg)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return msg;
}

nlohmann::json read_json(const fs::path& path, FileKind kind, const Roots& roots) {
  const std::string text = read_file(path, kind, roots);
  check_json_nesting(text, path.string());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(cat(path.string(), ": invalid JSON (", json_error_text(e), ")"));
  }
}

namespace {

// An optional integer field in [lo, hi]; unsigned values past int64 are out of range too.
std::optional<int64_t> opt_int(const json& j, const char* key, const std::string& origin, int64_t lo, int64_t hi,
                               const char* range) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  HEARTH_CHECK(it->is_number_integer(), origin, ": ", key, " must be an integer, got ", it->dump());
  const bool fits = !it->is_number_unsigned() || it->get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
  HEARTH_CHECK(fits && it->get<int64_t>() >= lo && it->get<int64_t>() <= hi, origin, ": ", key, " must be ", range,
               ", got ", it->dump());
  return it->get<int64_t>();
}

// An optional finite number field; `ok` tells whether the value is in range (`range` says which).
template <typename Ok>
std::optional<double> opt_num(const json& j, const char* key, const std::string& origin, Ok ok, const char* range) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  HEARTH_CHECK(it->is_number(), origin, ": ", key, " must be a number, got ", it->dump());
  const double v = it->get<double>();
  HEARTH_CHECK(std::isfinite(v) && ok(v), origin, ": ", key, " must be ", range, ", got ", it->dump());
  return v;
}

constexpr int64_t kMaxTokenId = INT32_MAX;

// A JSON value for a message: compact, at most ~100 characters.
std::string brief(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 100 ? s.substr(0, 100) + "..." : s;
}

}  // namespace

GenerationConfig GenerationConfig::load(const fs::path& dir) {
  GenerationConfig g;
  const fs::path path = dir / "generation_config.json";
  if (!entry_exists(path)) return g;
  const std::string origin = path.string();
  const json j = read_json(path);
  HEARTH_CHECK(j.is_object(), origin, ": not a JSON object");
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    const json list = it->is_array() ? *it : json::array({*it});
    for (const auto& v : list) {
      const bool ok = v.is_number_integer() && !v.is_number_unsigned() ? v.get<int64_t>() >= 0
                                                                       : v.is_number_unsigned();
      HEARTH_CHECK(ok && v.get<uint64_t>() <= static_cast<uint64_t>(kMaxTokenId), origin,
                   ": eos_token_id must be a token id (integer >= 0) or a list of them, got ", brief(*it));
      g.eos_token_ids.push_back(v.get<int64_t>());
    }
  }
  g.bos_token_id = opt_int(j, "bos_token_id", origin, 0, kMaxTokenId, "a token id (integer >= 0)");
  g.top_k = opt_int(j, "top_k", origin, 0, INT64_MAX, ">= 0 (0 = off)");
  g.temperature = opt_num(j, "temperature", origin, [](double v) { return v >= 0; }, "a finite number >= 0");
  g.top_p = opt_num(j, "top_p", origin, [](double v) { return v >= 0 && v <= 1; }, "in [0, 1]");
  g.min_p = opt_num(j, "min_p", origin, [](double v) { return v >= 0 && v <= 1; }, "in [0, 1]");
  g.repetition_penalty =
      opt_num(j, "repetition_penalty", origin, [](double v) { return v > 0; }, "a finite number > 0 (1 = off)");
  if (auto it = j.find("do_sample"); it != j.end() && !it->is_null()) {
    HEARTH_CHECK(it->is_boolean(), origin, ": do_sample must be true or false, got ", it->dump());
    g.do_sample = it->get<bool>();
  }
  return g;
}

}  // namespace hearth::io
