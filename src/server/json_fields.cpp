// Typed reads of request JSON fields with OpenAI-style 400s (see json_fields.h).
// Not tied to one API's request shape.
#include "server/json_fields.h"

#include <cmath>

#include "server/api_error.h"

namespace hearth::server {

using json = nlohmann::ordered_json;

std::string json_type_name(const json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

std::string json_num(double v) {
  std::string s = json(v).dump();
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}

void bad_value(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param, "invalid_value"); }

void bad_type(const std::string& param, const json& v, const char* expected) {
  throw ApiError(400, "Invalid type for '" + param + "': expected " + expected + ", but got " + json_type_name(v) + ".",
                 param, "invalid_type");
}

void missing(const std::string& param) {
  throw ApiError(400, "Missing required parameter: '" + param + "'.", param, "missing_required_parameter");
}

const json* json_field(const json& obj, const std::string& key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> number_in(const json& obj, const std::string& key, double lo, double hi, bool lo_open,
                                const std::string& param) {
  const std::string p = param.empty() ? key : param;
  const json* v = json_field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_type(p, *v, "a number");
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || (lo_open && d == lo) || d > hi)
    bad_value(p, "Invalid '" + p + "': expected a value in " + (lo_open ? "(" : "[") + json_num(lo) + ", " +
                     json_num(hi) + "], but got " + (std::isfinite(d) ? json_num(d) : v->dump()) + " instead.");
  return d;
}

std::optional<int64_t> integer_in(const json& obj, const std::string& key, int64_t lo, int64_t hi,
                                  const std::string& param) {
  const std::string p = param.empty() ? key : param;
  const json* v = json_field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_type(p, *v, "an integer");
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) bad_type(p, *v, "an integer");
    // hi as a double may round up (INT64_MAX becomes 2^63): compare below 2^63 too, so the cast
    // below is always defined.
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi) || d >= 0x1p63)
      bad_value(p, "Invalid '" + p + "': expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                       "], but got " + v->dump() + " instead.");
    return static_cast<int64_t>(d);
  }
  bool too_big = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi);
  int64_t i = too_big ? hi : v->get<int64_t>();
  if (too_big || i < lo || i > hi)
    bad_value(p, "Invalid '" + p + "': expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], but got " + v->dump() + " instead.");
  return i;
}

std::optional<bool> boolean_field(const json& obj, const std::string& key, const std::string& param) {
  const json* v = json_field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_type(param.empty() ? key : param, *v, "a boolean");
  return v->get<bool>();
}

std::optional<std::string> string_field(const json& obj, const std::string& key, const std::string& param) {
  const json* v = json_field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_type(param, *v, "a string");
  return v->get<std::string>();
}

}  // namespace hearth::server
