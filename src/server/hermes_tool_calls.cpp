// Hermes tool-call blocks -> ToolCall structs, plus the Engine's default parse hook.
// Not the per-model parsers of src/chat/ (those will replace the default hook).
#include "server/hermes_tool_calls.h"

#include <nlohmann/json.hpp>

#include <mutex>
#include <random>

namespace hearth::server {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

std::string_view trim(std::string_view s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

// Parses one block body; false when it is not a {"name": ..., "arguments": ...} object.
bool parse_block(std::string_view body, ToolCall& call) {
  auto j = nlohmann::json::parse(trim(body), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return false;
  call.name = name->get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end() || args->is_null()) {
    call.arguments_json = "{}";
  } else if (args->is_string()) {
    call.arguments_json = args->get<std::string>();
  } else {
    call.arguments_json = args->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  call.id = new_tool_call_id();
  return true;
}

}  // namespace

std::string new_tool_call_id() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  static const char* hex = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id.push_back(hex[rng() & 15]);
  return id;
}

ParsedToolCalls parse_hermes_tool_calls(std::string_view text) {
  ParsedToolCalls out;
  std::string content;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t open = text.find(kOpen, pos);
    if (open == std::string_view::npos) {
      content.append(text.substr(pos));
      break;
    }
    content.append(text.substr(pos, open - pos));
    size_t body_start = open + kOpen.size();
    size_t close = text.find(kClose, body_start);
    size_t body_end = close == std::string_view::npos ? text.size() : close;
    size_t next = close == std::string_view::npos ? text.size() : close + kClose.size();
    ToolCall call;
    if (parse_block(text.substr(body_start, body_end - body_start), call)) {
      out.calls.push_back(std::move(call));
    } else {
      content.append(text.substr(open, next - open));
    }
    pos = next;
  }
  out.content = std::string(trim(content));
  return out;
}

ParsedToolCalls Engine::parse_tool_calls(std::string_view text) const {
  return parse_hermes_tool_calls(text);
}

}  // namespace hearth::server
