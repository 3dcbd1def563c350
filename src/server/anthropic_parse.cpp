// Anthropic Messages request JSON -> CompletionRequest (see anthropic_api.h).
// Not the response shapes (anthropic_format.cpp) and not transport (server.cpp).
#include <limits>
#include <map>

#include "server/anthropic_api.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace hearth::server {
namespace {

using json = nlohmann::ordered_json;

constexpr int64_t kMaxTokensLimit = std::numeric_limits<int32_t>::max();

std::string at(const std::string& p, size_t i) { return p + "[" + std::to_string(i) + "]"; }

// A block's "type" (required string).
std::string block_type(const json& b, const std::string& p) {
  if (!b.is_object()) bad_type(p, b, "an object");
  auto type = string_field(b, "type", p + ".type");
  if (!type) missing(p + ".type");
  return *type;
}

std::string required_string(const json& obj, const std::string& key, const std::string& p) {
  auto s = string_field(obj, key, p + "." + key);
  if (!s) missing(p + "." + key);
  return *s;
}

// A string, or an array of {"type": "text", "text"} blocks joined by "\n" (system, tool_result).
std::string text_or_text_blocks(const json& v, const std::string& p) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad_type(p, v, "a string or an array of text blocks");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string bp = at(p, i);
    const std::string type = block_type(v[i], bp);
    if (type != "text")
      bad_value(bp + ".type", "Unsupported block type '" + type + "' in '" + bp + "': only text blocks are accepted here.");
    if (i > 0) out += "\n";
    out += required_string(v[i], "text", bp);
  }
  return out;
}

// One Anthropic message -> one or more chat messages (a user turn's tool_result blocks become
// "tool" messages, in order, before its text). `call_names`: tool_use id -> name, so far.
void convert_message(const json& m, const std::string& p, std::map<std::string, std::string>& call_names,
                     std::vector<ChatMessage>& out) {
  if (!m.is_object()) bad_type(p, m, "an object");
  auto role = string_field(m, "role", p + ".role");
  if (!role) missing(p + ".role");
  if (*role != "user" && *role != "assistant")
    bad_value(p + ".role", "Invalid value for '" + p + ".role': '" + *role + "'. Supported values are: 'user' and 'assistant'.");
  const json* c = json_field(m, "content");
  if (!c) missing(p + ".content");
  ChatMessage msg;
  msg.role = *role;
  if (c->is_string()) {
    msg.content = c->get<std::string>();
    out.push_back(std::move(msg));
    return;
  }
  if (!c->is_array()) bad_type(p + ".content", *c, "a string or an array of content blocks");
  std::optional<std::string> text;
  bool any_tool_result = false;
  auto flush_user_text = [&] {
    if (!text) return;
    ChatMessage u;
    u.role = "user";
    u.content = std::move(text);
    text.reset();
    out.push_back(std::move(u));
  };
  for (size_t i = 0; i < c->size(); ++i) {
    const json& b = (*c)[i];
    const std::string bp = at(p + ".content", i);
    const std::string type = block_type(b, bp);
    if (type == "text") {
      const std::string t = required_string(b, "text", bp);
      text = text ? *text + "\n" + t : t;
    } else if (type == "tool_use" && msg.role == "assistant") {
      ToolCall call;
      call.id = required_string(b, "id", bp);
      call.name = required_string(b, "name", bp);
      const json* input = json_field(b, "input");
      if (input && !input->is_object()) bad_type(bp + ".input", *input, "an object");
      call.arguments_json = input ? input->dump() : "{}";
      call_names[call.id] = call.name;
      msg.tool_calls.push_back(std::move(call));
    } else if (type == "thinking" && msg.role == "assistant") {
      const std::string t = required_string(b, "thinking", bp);
      msg.reasoning_content = msg.reasoning_content ? *msg.reasoning_content + "\n" + t : t;
    } else if (type == "redacted_thinking" && msg.role == "assistant") {
      // Encrypted by another provider: nothing a local model can read.
    } else if (type == "tool_result" && msg.role == "user") {
      flush_user_text();  // text before a result stays before it
      any_tool_result = true;
      ChatMessage t;
      t.role = "tool";
      t.tool_call_id = required_string(b, "tool_use_id", bp);
      const json* rc = json_field(b, "content");
      t.content = rc ? text_or_text_blocks(*rc, bp + ".content") : std::string();
      if (auto it = call_names.find(t.tool_call_id); it != call_names.end()) t.name = it->second;
      out.push_back(std::move(t));
    } else {
      const bool known = type == "tool_use" || type == "thinking" || type == "redacted_thinking" || type == "tool_result";
      bad_value(bp + ".type", known ? "Invalid '" + bp + "': a '" + type + "' block is not allowed in a " + msg.role + " message."
                                    : "Unsupported content block type '" + type + "' in '" + bp +
                                          "': this server accepts text, tool_use, tool_result and thinking blocks.");
    }
  }
  if (msg.role == "user") {
    if (text || !any_tool_result) {
      if (!text) text = std::string();
      flush_user_text();
    }
    return;
  }
  msg.content = text;
  if (!msg.content && msg.tool_calls.empty()) msg.content = std::string();
  out.push_back(std::move(msg));
}

void parse_tools(const json& body, CompletionRequest& req) {
  if (const json* tools = json_field(body, "tools")) {
    if (!tools->is_array()) bad_type("tools", *tools, "an array");
    json out = json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string p = at("tools", i);
      if (!t.is_object()) bad_type(p, t, "an object");
      const std::string type = string_field(t, "type", p + ".type").value_or("custom");
      if (type != "custom")
        bad_value(p + ".type", "Unsupported tool type '" + type + "' in '" + p +
                                   "': this server runs client tools only (name, description, input_schema).");
      json fn = {{"name", required_string(t, "name", p)}};
      if (auto d = string_field(t, "description", p + ".description")) fn["description"] = *d;
      const json* schema = json_field(t, "input_schema");
      if (!schema) missing(p + ".input_schema");
      if (!schema->is_object()) bad_type(p + ".input_schema", *schema, "an object");
      fn["parameters"] = *schema;
      out.push_back(json{{"type", "function"}, {"function", std::move(fn)}});
    }
    req.tools = std::move(out);
  }
  if (const json* tc = json_field(body, "tool_choice")) {
    if (!tc->is_object()) bad_type("tool_choice", *tc, "an object");
    auto type = string_field(*tc, "type", "tool_choice.type");
    if (!type) missing("tool_choice.type");
    if (*type == "auto" || *type == "none") req.tool_choice = *type;
    else if (*type == "any") req.tool_choice = "required";
    else if (*type == "tool") req.tool_choice = "function", req.tool_choice_name = required_string(*tc, "name", "tool_choice");
    else
      bad_value("tool_choice.type", "Invalid value for 'tool_choice.type': '" + *type +
                                        "'. Supported values are: 'auto', 'any', 'tool' and 'none'.");
  }
}

}  // namespace

CompletionRequest parse_anthropic_request(const json& body, bool count_only) {
  CompletionRequest req;
  req.chat = true;
  req.model = string_field(body, "model", "model").value_or("");
  if (const json* sys = json_field(body, "system")) {
    ChatMessage m;
    m.role = "system";
    m.content = text_or_text_blocks(*sys, "system");
    req.messages.push_back(std::move(m));
  }
  const json* ms = json_field(body, "messages");
  if (!ms) missing("messages");
  if (!ms->is_array()) bad_type("messages", *ms, "an array");
  if (ms->empty()) bad_value("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1.");
  std::map<std::string, std::string> call_names;
  for (size_t i = 0; i < ms->size(); ++i) convert_message((*ms)[i], at("messages", i), call_names, req.messages);
  if (ms->back().is_object() && ms->back().value("role", "") == "assistant")
    bad_value(at("messages", ms->size() - 1) + ".role",
              "Invalid '" + at("messages", ms->size() - 1) + "': the last message is the assistant's; continuing a "
              "prefilled assistant turn is not supported by this server. End with a user message.");
  if (!count_only) {
    req.max_tokens = integer_in(body, "max_tokens", 1, kMaxTokensLimit);
    if (!req.max_tokens) missing("max_tokens");
  }
  if (const json* stop = json_field(body, "stop_sequences")) {
    if (!stop->is_array()) bad_type("stop_sequences", *stop, "an array of strings");
    if (stop->size() > 16) bad_value("stop_sequences", "Invalid 'stop_sequences': at most 16 stop sequences are supported.");
    for (size_t i = 0; i < stop->size(); ++i) {
      if (!(*stop)[i].is_string()) bad_type(at("stop_sequences", i), (*stop)[i], "a string");
      if (!(*stop)[i].get<std::string>().empty()) req.stop.push_back((*stop)[i].get<std::string>());
    }
  }
  req.sampling.temperature = number_in(body, "temperature", 0, 1);
  req.sampling.top_p = number_in(body, "top_p", 0, 1);
  req.sampling.top_k = integer_in(body, "top_k", 0, kMaxTokensLimit);
  // Not in Anthropic's API: an extension, seeded exactly as chat/completions' `seed` (any int64).
  req.sampling.seed = integer_in(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  parse_tools(body, req);
  if (const json* th = json_field(body, "thinking")) {
    if (!th->is_object()) bad_type("thinking", *th, "an object");
    auto type = string_field(*th, "type", "thinking.type");
    if (!type) missing("thinking.type");
    if (*type != "enabled" && *type != "disabled" && *type != "adaptive")
      bad_value("thinking.type", "Invalid value for 'thinking.type': '" + *type +
                                     "'. Supported values are: 'enabled', 'adaptive' and 'disabled'.");
    req.chat_template_kwargs["enable_thinking"] = *type != "disabled";
  }
  req.stream = boolean_field(body, "stream").value_or(false);
  // Per-request LoRA selection, as chat/completions ("id", "a+b", "none"); `model` may also name an
  // adapter (resolve_model).
  req.adapter = string_field(body, "adapter", "adapter");
  return req;
}

}  // namespace hearth::server
