// Gemma 4 tool calls: <|tool_call>call:NAME{key:<|"|>text<|"|>,n:1,flag:true,xs:[…],o:{…}}<tool_call|>.
// A recursive-descent reader of the value syntax the Gemma 4 chat template writes
// (format_argument with escape_keys=False), with the semantics of mlx-lm's
// tool_parsers/gemma4.py: <|"|>-quoted strings verbatim, other scalars JSON-decoded when they
// parse, else kept as text. Unlike that parser it reads nested objects/lists and several calls.
// Not the prompt side: the template renders calls and tool responses itself.
#include <random>

#include "chat/tool_calls.h"
#include "chat/value.h"

namespace hearth::chat {
namespace {
using nlohmann::ordered_json;

constexpr std::string_view kOpen = "<|tool_call>";
constexpr std::string_view kClose = "<tool_call|>";
constexpr std::string_view kQuote = "<|\"|>";
constexpr std::string_view kCall = "call:";
constexpr int kMaxDepth = 64;  // nesting bound: model output must never exhaust the stack

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ws(s[b])) ++b;
  while (e > b && is_ws(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

std::string new_call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rng() & 0xffffffffu));
  return std::string("call_") + buf;
}

// Reads one call body; every method returns false on malformed input (never throws).
struct Reader {
  std::string_view s;
  size_t i = 0;

  bool at(std::string_view t) const { return s.compare(i, t.size(), t) == 0; }
  void ws() {
    while (i < s.size() && is_ws(s[i])) ++i;
  }

  // <|"|>text<|"|> -> text, verbatim.
  bool quoted(std::string& out) {
    i += kQuote.size();
    size_t e = s.find(kQuote, i);
    if (e == std::string_view::npos) return false;
    out.assign(s.substr(i, e - i));
    i = e + kQuote.size();
    return true;
  }

  bool value(ordered_json& out, int depth) {
    if (depth > kMaxDepth) return false;
    ws();
    if (i >= s.size()) return false;
    if (at(kQuote)) {
      std::string str;
      if (!quoted(str)) return false;
      out = std::move(str);
      return true;
    }
    if (s[i] == '{') return object(out, depth + 1);
    if (s[i] == '[') return array(out, depth + 1);
    // A bare scalar runs to the next separator of the enclosing container.
    size_t b = i;
    while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && !at(kQuote) && !at(kClose) && !at(kOpen)) ++i;
    std::string tok = trim(s.substr(b, i - b));
    ordered_json parsed = ordered_json::parse(tok, nullptr, /*allow_exceptions=*/false);
    out = parsed.is_discarded() || tok.empty() ? ordered_json(tok) : parsed;  // mlx-lm: json.loads, else the text
    return true;
  }

  bool key(std::string& out) {
    ws();
    if (at(kQuote)) return quoted(out);
    size_t b = i;
    while (i < s.size() && s[i] != ':' && s[i] != ',' && s[i] != '}' && s[i] != '{' && s[i] != '[' && s[i] != ']') ++i;
    out = trim(s.substr(b, i - b));
    return !out.empty();
  }

  bool object(ordered_json& out, int depth) {
    ++i;  // '{'
    out = ordered_json::object();
    ws();
    if (i < s.size() && s[i] == '}') {
      ++i;
      return true;
    }
    for (;;) {
      std::string k;
      if (!key(k)) return false;
      ws();
      if (i >= s.size() || s[i] != ':') return false;
      ++i;
      ordered_json v;
      if (!value(v, depth)) return false;
      out[k] = std::move(v);
      ws();
      if (i >= s.size()) return false;
      if (s[i] == ',') {
        ++i;
        continue;
      }
      if (s[i] != '}') return false;
      ++i;
      return true;
    }
  }

  bool array(ordered_json& out, int depth) {
    ++i;  // '['
    out = ordered_json::array();
    ws();
    if (i < s.size() && s[i] == ']') {
      ++i;
      return true;
    }
    for (;;) {
      ordered_json v;
      if (!value(v, depth)) return false;
      out.push_back(std::move(v));
      ws();
      if (i >= s.size()) return false;
      if (s[i] == ',') {
        ++i;
        continue;
      }
      if (s[i] != ']') return false;
      ++i;
      return true;
    }
  }

  // call:NAME{...}
  bool call(ToolCall& out) {
    ws();
    if (!at(kCall)) return false;
    i += kCall.size();
    size_t b = i;
    while (i < s.size() && s[i] != '{' && !is_ws(s[i]) && s[i] != '<') ++i;
    std::string name(s.substr(b, i - b));
    ws();
    if (name.empty() || i >= s.size() || s[i] != '{') return false;
    ordered_json args;
    if (!object(args, 1)) return false;
    out.id = new_call_id();
    out.name = std::move(name);
    out.arguments_json = Value::from_json(args).to_json(false, -1, "", ", ", ": ");  // Python json.dumps spacing
    return true;
  }
};

}  // namespace

ParsedToolCalls parse_gemma4_tool_calls(const std::string& text) {
  ParsedToolCalls r;
  std::string content;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t b = text.find(kOpen, pos);
    if (b == std::string::npos) {
      content.append(text, pos, std::string::npos);
      break;
    }
    Reader rd{text, b + kOpen.size()};
    ToolCall call;
    bool ok = rd.call(call);
    size_t end = rd.i;
    if (ok) {
      rd.ws();
      if (rd.at(kClose)) end = rd.i + kClose.size();
      else if (rd.i >= text.size() || rd.at(kOpen)) end = rd.i;  // no closing tag: ends at the next call or the end
      else ok = false;
    }
    if (ok) {
      content.append(text, pos, b - pos);
      r.calls.push_back(std::move(call));
    } else {
      // Malformed: the markup up to its closing tag (or the next call, or the end) stays content.
      size_t close = text.find(kClose, b + kOpen.size());
      size_t next = text.find(kOpen, b + kOpen.size());
      end = close != std::string::npos && (next == std::string::npos || close < next) ? close + kClose.size()
            : next != std::string::npos                                               ? next
                                                                                      : text.size();
      content.append(text, pos, end - pos);
    }
    pos = end;
  }
  r.content = r.calls.empty() ? text : trim(content);
  return r;
}

size_t gemma4_tool_call_holdback_start(const std::string& text) {
  size_t p = text.find(kOpen);
  if (p != std::string::npos) return p;
  const size_t max = std::min(text.size(), kOpen.size() - 1);
  for (size_t n = max; n > 0; --n)
    if (text.compare(text.size() - n, n, kOpen.data(), n) == 0) return text.size() - n;
  return text.size();
}

}  // namespace hearth::chat
