// Typed reads of tokenizer.json fields that fail with one line "<origin>: <field>: <problem>".
// Not a JSON parser (nlohmann::json is) and not a schema: each component checks its own keys.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "core/error.h"

namespace hearth::tokenizer::jf {

using json = nlohmann::json;

/// Where a value lives: the file (or origin name) and the dotted field path inside it.
struct At {
  std::string origin;
  std::string field;
  At operator/(const std::string& key) const { return {origin, field.empty() ? key : field + "." + key}; }
  At operator[](size_t i) const { return {origin, field + "[" + std::to_string(i) + "]"}; }
  [[noreturn]] void fail(const std::string& problem) const {
    throw Error(cat(origin, ": ", field.empty() ? "(root)" : field, ": ", problem));
  }
};

/// `obj[key]`, failing when `obj` is not an object or the key is missing (or null).
inline const json& need(const json& obj, const char* key, const At& at) {
  if (!obj.is_object()) at.fail("expected an object");
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) (at / key).fail("missing");
  return *it;
}

inline std::string str(const json& v, const At& at) {
  if (!v.is_string()) at.fail("expected a string");
  return v.get<std::string>();
}

inline bool boolean(const json& v, const At& at) {
  if (!v.is_boolean()) at.fail("expected true or false");
  return v.get<bool>();
}

inline int64_t integer(const json& v, const At& at) {
  if (!v.is_number_integer() && !v.is_number_unsigned()) at.fail("expected an integer");
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) at.fail("integer out of range");
    return static_cast<int64_t>(u);
  }
  return v.get<int64_t>();
}

/// An optional key: `fallback` when absent or null, else the checked value.
inline bool opt_bool(const json& obj, const char* key, bool fallback, const At& at) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? fallback : boolean(*it, at / key);
}
inline std::string opt_str(const json& obj, const char* key, const std::string& fallback, const At& at) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? fallback : str(*it, at / key);
}

/// A token id: an integer in [0, 2^31).
inline int32_t token_id(const json& v, const At& at) {
  int64_t i = integer(v, at);
  if (i < 0 || i > INT32_MAX) at.fail("token id out of range");
  return static_cast<int32_t>(i);
}

}  // namespace hearth::tokenizer::jf
