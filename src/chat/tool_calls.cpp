// Tool-call parsers for Hermes JSON, XML-parameter and Llama-3 JSON outputs, plus streaming
// hold-back. Follows the conventions of the templates that define them (Qwen3, Qwen3.5/MiniCPM,
// Llama 3.x). Not a JSON-schema validator: the schema only picks how an XML value is decoded.
#include "chat/tool_calls.h"

#include <cctype>
#include <random>

#include "chat/value.h"
#include "core/json_nesting.h"

namespace hearth::chat {
namespace {
using nlohmann::ordered_json;

constexpr const char* kOpen = "<tool_call>";
constexpr const char* kClose = "</tool_call>";
constexpr const char* kPythonTag = "<|python_tag|>";

std::string new_call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rng() & 0xffffffffu));
  return std::string("call_") + buf;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ws(s[b])) ++b;
  while (e > b && is_ws(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// Parses JSON text from model output; discarded when malformed or nested deeper than kMaxNesting
// (a deep value must not reach the recursive copy/dump/convert code).
ordered_json parse_json(const std::string& text) {
  if (json_nesting_violation(text)) return ordered_json(ordered_json::value_t::discarded);
  return ordered_json::parse(text, nullptr, false);
}

// The offset of the first `tag` at or after `from` that is not inside a JSON string, for a body
// that is JSON (starts with '{' or '[' after whitespace): a "</tool_call>" written inside an
// argument string does not end the call. npos when there is none outside strings.
size_t find_tag_outside_json_strings(const std::string& text, size_t from, const std::string& tag) {
  bool in_string = false;
  for (size_t i = from; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == tag[0] && text.compare(i, tag.size(), tag) == 0) {
      return i;
    }
  }
  return std::string::npos;
}

// Python json.dumps(obj, ensure_ascii=False) of a parsed JSON value.
std::string dumps(const ordered_json& j) { return Value::from_json(j).to_json(false, -1, "", ", ", ": "); }

// {"name": str, "arguments"|"parameters": object|str} -> ToolCall; false when it is not one.
bool json_to_call(const ordered_json& j, ToolCall& out) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  const char* key = j.contains("arguments") ? "arguments" : j.contains("parameters") ? "parameters" : nullptr;
  ordered_json args = key ? j[key] : ordered_json::object();
  if (args.is_string()) {  // some models emit the arguments as a JSON string
    ordered_json inner = parse_json(args.get<std::string>());
    if (inner.is_discarded() || !inner.is_object()) return false;
    args = inner;
  }
  if (!args.is_object()) return false;
  out.id = new_call_id();
  out.name = j["name"].get<std::string>();
  out.arguments_json = dumps(args);
  return true;
}

// The JSON schema "type" of parameter `param` of tool `fn` ("" when unknown).
std::string param_type(const ordered_json& tools, const std::string& fn, const std::string& param) {
  if (!tools.is_array()) return "";
  for (const auto& t : tools) {
    const ordered_json& f = t.contains("function") ? t["function"] : t;
    if (!f.is_object() || f.value("name", "") != fn) continue;
    if (!f.contains("parameters") || !f["parameters"].is_object()) return "";
    const auto& params = f["parameters"];
    if (!params.contains("properties") || !params["properties"].is_object() || !params["properties"].contains(param))
      return "";
    const auto& ty = params["properties"][param].contains("type") ? params["properties"][param]["type"] : ordered_json();
    if (ty.is_string()) return ty.get<std::string>();
    if (ty.is_array())
      for (const auto& x : ty)
        if (x.is_string() && x.get<std::string>() != "null") return x.get<std::string>();
    return "";
  }
  return "";
}

// <function=NAME><parameter=K>v</parameter>...</function> -> ToolCall.
bool xml_to_call(const std::string& body, const ordered_json& tools, ToolCall& out) {
  std::string s = trim(body);
  const std::string fopen = "<function=";
  if (s.compare(0, fopen.size(), fopen) != 0) return false;
  size_t gt = s.find('>', fopen.size());
  if (gt == std::string::npos) return false;
  std::string name = trim(s.substr(fopen.size(), gt - fopen.size()));
  size_t fend = s.rfind("</function>");
  if (name.empty() || fend == std::string::npos || fend < gt) return false;
  std::string inner = s.substr(gt + 1, fend - gt - 1);
  ordered_json args = ordered_json::object();
  size_t pos = 0;
  const std::string popen = "<parameter=", pclose = "</parameter>";
  while (true) {
    size_t p = inner.find(popen, pos);
    if (p == std::string::npos) {
      if (!trim(inner.substr(pos)).empty()) return false;  // stray text between parameters
      break;
    }
    if (!trim(inner.substr(pos, p - pos)).empty()) return false;
    size_t kgt = inner.find('>', p + popen.size());
    if (kgt == std::string::npos) return false;
    std::string key = trim(inner.substr(p + popen.size(), kgt - p - popen.size()));
    if (key.empty()) return false;
    // The value ends at </parameter>, or (when the model left it out) at the next <parameter=
    // (vLLM's qwen3coder parser does the same), or at the end of the function body.
    size_t vend = inner.find(pclose, kgt + 1);
    size_t next_open = inner.find(popen, kgt + 1);
    bool closed = vend != std::string::npos && (next_open == std::string::npos || vend < next_open);
    if (!closed) vend = next_open == std::string::npos ? inner.size() : next_open;
    std::string value = inner.substr(kgt + 1, vend - kgt - 1);
    if (!value.empty() && value.front() == '\n') value.erase(0, 1);
    if (!value.empty() && value.back() == '\n') value.pop_back();
    args[key] = xml_param_value(value, param_type(tools, name, key));
    pos = closed ? vend + pclose.size() : vend;
  }
  out.id = new_call_id();
  out.name = name;
  out.arguments_json = dumps(args);
  return true;
}

ParsedToolCalls parse_tagged(const std::string& text, ToolCallFormat fmt, const ordered_json& tools) {
  ParsedToolCalls r;
  std::string content;
  size_t pos = 0;
  const size_t open_len = std::char_traits<char>::length(kOpen), close_len = std::char_traits<char>::length(kClose);
  while (true) {
    size_t b = text.find(kOpen, pos);
    if (b == std::string::npos) {
      content += text.substr(pos);
      break;
    }
    size_t body_start = b + open_len;
    while (body_start < text.size() && is_ws(text[body_start])) ++body_start;
    size_t e = std::string::npos;
    if (body_start < text.size() && (text[body_start] == '{' || text[body_start] == '['))
      e = find_tag_outside_json_strings(text, body_start, kClose);
    if (e == std::string::npos) e = text.find(kClose, b + open_len);
    size_t body_end = e == std::string::npos ? text.size() : e;  // unclosed: generation stopped at the tag
    std::string body = text.substr(b + open_len, body_end - b - open_len);
    ToolCall call;
    bool ok = false;
    if (fmt == ToolCallFormat::Xml && trim(body).rfind("<function=", 0) == 0) {
      ok = xml_to_call(body, tools, call);
    } else {
      ordered_json j = parse_json(trim(body));
      ok = !j.is_discarded() && json_to_call(j, call);
    }
    size_t next = e == std::string::npos ? text.size() : e + close_len;
    if (ok) {
      content += text.substr(pos, b - pos);
      r.calls.push_back(std::move(call));
    } else {
      content += text.substr(pos, next - pos);
    }
    pos = next;
    if (pos >= text.size()) break;
  }
  r.content = r.calls.empty() ? text : trim(content);
  return r;
}

ParsedToolCalls parse_llama3(const std::string& text) {
  ParsedToolCalls r;
  r.content = text;
  std::string s = trim(text);
  size_t tag = s.find(kPythonTag);
  std::string prefix;
  if (tag != std::string::npos) {
    prefix = trim(s.substr(0, tag));
    s = trim(s.substr(tag + std::char_traits<char>::length(kPythonTag)));
  }
  if (s.empty() || (s[0] != '{' && s[0] != '[')) return r;
  std::vector<ordered_json> objs;
  ordered_json j = parse_json(s);
  if (!j.is_discarded()) {
    if (j.is_array()) for (const auto& x : j) objs.push_back(x);
    else objs.push_back(j);
  } else {  // several calls separated by ';'
    size_t start = 0;
    while (start < s.size()) {
      size_t semi = s.find(';', start);
      for (; semi != std::string::npos; semi = s.find(';', semi + 1)) {
        ordered_json part = parse_json(s.substr(start, semi - start));
        if (!part.is_discarded()) break;
      }
      std::string piece = s.substr(start, semi == std::string::npos ? std::string::npos : semi - start);
      ordered_json part = parse_json(piece);
      if (part.is_discarded()) return r;
      objs.push_back(part);
      if (semi == std::string::npos) break;
      start = semi + 1;
      while (start < s.size() && is_ws(s[start])) ++start;
    }
  }
  std::vector<ToolCall> calls;
  for (const auto& o : objs) {
    ToolCall c;
    if (!json_to_call(o, c)) return r;
    calls.push_back(std::move(c));
  }
  if (calls.empty()) return r;
  r.calls = std::move(calls);
  r.content = prefix;
  return r;
}

// Offset of the longest suffix of `text` that is a proper prefix of `marker` (text.size() if none).
size_t partial_marker(const std::string& text, const std::string& marker) {
  size_t max = std::min(text.size(), marker.size() - 1);
  for (size_t n = max; n > 0; --n)
    if (text.compare(text.size() - n, n, marker, 0, n) == 0) return text.size() - n;
  return text.size();
}

}  // namespace

ToolCallFormat detect_tool_call_format(const std::string& t) {
  if (t.find("<|tool_call>") != std::string::npos) return ToolCallFormat::Gemma4;
  if (t.find("<tool_call>") != std::string::npos)
    return t.find("<function=") != std::string::npos ? ToolCallFormat::Xml : ToolCallFormat::Hermes;
  if (t.find(kPythonTag) != std::string::npos) return ToolCallFormat::Llama3Json;
  if (t.find("<|start_header_id|>") != std::string::npos && t.find("\"parameters\"") != std::string::npos)
    return ToolCallFormat::Llama3Json;
  return ToolCallFormat::None;
}

ParsedToolCalls parse_tool_calls(const std::string& text, ToolCallFormat format, const ordered_json& tools) {
  try {
    switch (format) {
      case ToolCallFormat::Hermes:
      case ToolCallFormat::Xml: return parse_tagged(text, format, tools);
      case ToolCallFormat::Llama3Json: return parse_llama3(text);
      case ToolCallFormat::Gemma4: return parse_gemma4_tool_calls(text);
      case ToolCallFormat::None: break;
    }
  } catch (const std::exception&) {  // defensive: model output must never raise
  }
  return ParsedToolCalls{text, {}};
}

size_t tool_call_holdback_start(const std::string& text, ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::Hermes:
    case ToolCallFormat::Xml: {
      size_t p = text.find(kOpen);
      return p != std::string::npos ? p : partial_marker(text, kOpen);
    }
    case ToolCallFormat::Llama3Json: {
      size_t p = text.find(kPythonTag);
      if (p != std::string::npos) return p;
      size_t b = 0;
      while (b < text.size() && is_ws(text[b])) ++b;
      if (b == text.size() || text[b] == '{' || text[b] == '[') return 0;  // may be a bare JSON call
      return partial_marker(text, kPythonTag);
    }
    case ToolCallFormat::Gemma4: return gemma4_tool_call_holdback_start(text);
    case ToolCallFormat::None: break;
  }
  return text.size();
}

std::string tool_call_start_marker(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::Hermes:
    case ToolCallFormat::Xml: return kOpen;
    case ToolCallFormat::Llama3Json: return kPythonTag;
    case ToolCallFormat::Gemma4: return "<|tool_call>";
    case ToolCallFormat::None: break;
  }
  return "";
}

}  // namespace hearth::chat
