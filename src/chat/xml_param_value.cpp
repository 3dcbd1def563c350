// Typing of Qwen XML tool-call parameter values (<parameter=K>value</parameter>) from the tool's
// JSON-schema type, as Qwen's reference parser does (qwen3coder_tool_parser.py, mirrored by vLLM
// and mlx-lm's tool_parsers/qwen3_coder.py). Not the XML scanner (tool_calls.cpp finds the values).
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "chat/tool_calls.h"
#include "core/json_nesting.h"

namespace hearth::chat {
namespace {
using nlohmann::ordered_json;

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ws(s[b])) ++b;
  while (e > b && is_ws(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool starts(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// Python int(text): optional sign and decimal digits (surrounding whitespace allowed).
bool py_int(const std::string& text, ordered_json& out) {
  std::string t = trim(text);
  size_t i = (!t.empty() && (t[0] == '+' || t[0] == '-')) ? 1 : 0;
  if (i == t.size()) return false;
  for (size_t k = i; k < t.size(); ++k)
    if (t[k] < '0' || t[k] > '9') return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(t.c_str(), &end, 10);
  if (errno == ERANGE) return false;  // beyond int64: kept as text
  out = static_cast<int64_t>(v);
  return true;
}

// Python float(text), then an integral value becomes an int (3.0 -> 3); inf/nan fail (Qwen's
// int(float) raises on them, and the text is kept).
bool py_number(const std::string& text, ordered_json& out) {
  std::string t = trim(text);
  if (t.empty()) return false;
  for (char c : t)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.' || c == 'e' || c == 'E'))
      return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v)) return false;
  if (v == std::trunc(v) && std::fabs(v) < 9.2e18) out = static_cast<int64_t>(v);
  else out = v;
  return true;
}

// ast.literal_eval for the JSON-like subset models write: Python dict/list/str/number literals
// with 'single-quoted' strings and True/False/None, rewritten to JSON and parsed.
bool py_literal(const std::string& text, ordered_json& out) {
  const std::string t = trim(text);
  std::string j;
  j.reserve(t.size() + 8);
  for (size_t i = 0; i < t.size();) {
    char c = t[i];
    if (c == '\'' || c == '"') {
      std::string s;
      size_t k = i + 1;
      for (; k < t.size() && t[k] != c; ++k) {
        if (t[k] == '\\' && k + 1 < t.size()) {
          char n = t[++k];
          s += n == 'n' ? '\n' : n == 't' ? '\t' : n == 'r' ? '\r' : n;
          continue;
        }
        s += t[k];
      }
      if (k >= t.size()) return false;
      j += ordered_json(s).dump();
      i = k + 1;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t k = i;
      while (k < t.size() && (std::isalnum(static_cast<unsigned char>(t[k])) || t[k] == '_')) ++k;
      std::string w = t.substr(i, k - i);
      if (w == "True") j += "true";
      else if (w == "False") j += "false";
      else if (w == "None") j += "null";
      else if (w == "e" || w == "E") j += w;  // exponent inside a number
      else return false;
      i = k;
    } else {
      j += c;
      ++i;
    }
  }
  ordered_json parsed = ordered_json::parse(j, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return false;
  out = std::move(parsed);
  return true;
}

}  // namespace

ordered_json xml_param_value(const std::string& raw, const std::string& schema_type) {
  if (lower(raw) == "null") return nullptr;  // any type, as the reference
  const std::string ty = lower(trim(schema_type));
  if (ty.empty() || ty == "string" || ty == "str" || ty == "text" || ty == "varchar" || ty == "char" || ty == "enum")
    return raw;  // unknown parameter, no type, or a string type: the text as written
  if (json_nesting_violation(raw)) return raw;  // too deep to parse safely: kept as text
  ordered_json v;
  if (starts(ty, "int") || starts(ty, "uint") || starts(ty, "long") || starts(ty, "short") || starts(ty, "unsigned"))
    return py_int(raw, v) ? v : ordered_json(raw);
  if (starts(ty, "num") || starts(ty, "float")) return py_number(raw, v) ? v : ordered_json(raw);
  if (ty == "boolean" || ty == "bool" || ty == "binary") {
    const std::string b = lower(trim(raw));
    if (b == "true" || b == "false") return b == "true";
    return raw;  // the reference maps any other text to false; keeping it is not a silent wrong value
  }
  if (ty == "object" || ty == "array" || ty == "arr" || starts(ty, "dict") || starts(ty, "list")) {
    ordered_json parsed = ordered_json::parse(trim(raw), nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) return parsed;
  }
  return py_literal(raw, v) ? v : ordered_json(raw);
}

}  // namespace hearth::chat
