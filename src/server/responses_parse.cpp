// OpenAI Responses request JSON -> CompletionRequest (see responses_api.h).
// Not the response shapes (responses_format.cpp) and not transport (server.cpp).
#include <limits>
#include <map>

#include "core/json_nesting.h"
#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/responses_api.h"
#include "server/structured_output.h"

namespace hearth::server {
namespace {

using json = nlohmann::ordered_json;

constexpr int64_t kMaxTokensLimit = std::numeric_limits<int32_t>::max();

std::string at(const std::string& p, size_t i) { return p + "[" + std::to_string(i) + "]"; }

std::string required_string(const json& obj, const std::string& key, const std::string& p) {
  auto s = string_field(obj, key, p + "." + key);
  if (!s) missing(p + "." + key);
  return *s;
}

// A string, or content parts of the given text types (concatenated, as chat content parts).
std::string text_of(const json& v, const std::string& p, std::initializer_list<const char*> types) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad_type(p, v, "a string or an array of content parts");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string pp = at(p, i);
    if (!v[i].is_object()) bad_type(pp, v[i], "an object");
    auto type = string_field(v[i], "type", pp + ".type");
    if (!type) missing(pp + ".type");
    bool ok = false;
    for (const char* t : types) ok = ok || *type == t;
    if (!ok)
      bad_value(pp + ".type", "Unsupported content part type '" + *type + "' in '" + pp +
                                  "': this server accepts text parts only.");
    out += required_string(v[i], "text", pp);
  }
  return out;
}

// The text of a reasoning item: its content (reasoning_text) if any, else its summary.
std::string reasoning_text(const json& item, const std::string& p) {
  std::string out;
  for (const char* key : {"content", "summary"}) {
    const json* parts = json_field(item, key);
    if (!parts) continue;
    if (!parts->is_array()) bad_type(p + "." + key, *parts, "an array");
    for (size_t i = 0; i < parts->size(); ++i) {
      const json& part = (*parts)[i];
      if (!part.is_object()) bad_type(at(p + "." + key, i), part, "an object");
      if (auto t = string_field(part, "text", at(p + "." + key, i) + ".text")) out += (out.empty() ? "" : "\n") + *t;
    }
    if (!out.empty()) break;
  }
  return out;
}

std::vector<ChatMessage> parse_input(const json& input) {
  std::vector<ChatMessage> out;
  if (input.is_string()) {
    out.push_back(ChatMessage{"user", input.get<std::string>(), "", "", {}, std::nullopt});
    return out;
  }
  if (!input.is_array()) bad_type("input", input, "a string or an array of input items");
  if (input.empty()) bad_value("input", "Invalid 'input': empty array. Expected an array with minimum length 1.");
  std::map<std::string, std::string> call_names;
  std::optional<std::string> pending_reasoning;  // reasoning items waiting for the assistant turn they belong to
  std::string reasoning_at;                      // the first of them, for errors
  // A reasoning item belongs to the assistant message or function_call that follows it (OpenAI
  // refuses one "provided without its required following item"); anywhere else it would be
  // dropped or moved, so it is refused.
  auto reasoning_unclaimed = [&]() {
    bad_value(reasoning_at, "Invalid '" + reasoning_at + "': a reasoning item must be followed by the assistant message "
                                "or function_call it belongs to.");
  };
  bool last_was_call = false;  // the previous item was a function_call (consecutive calls share one turn)
  for (size_t i = 0; i < input.size(); ++i) {
    const json& it = input[i];
    const std::string p = at("input", i);
    if (!it.is_object()) bad_type(p, it, "an object");
    const std::string type = string_field(it, "type", p + ".type").value_or("message");
    const bool was_call = last_was_call;
    last_was_call = false;
    if (type == "message") {
      ChatMessage m;
      const std::string role = required_string(it, "role", p);
      m.role = role == "developer" ? "system" : role;
      if (m.role != "user" && m.role != "assistant" && m.role != "system")
        bad_value(p + ".role", "Invalid value for '" + p + ".role': '" + role +
                                   "'. Supported values are: 'user', 'assistant', 'system' and 'developer'.");
      const json* c = json_field(it, "content");
      if (!c) missing(p + ".content");
      m.content = text_of(*c, p + ".content", {"input_text", "output_text", "text", "refusal"});
      if (m.role != "assistant" && pending_reasoning) reasoning_unclaimed();
      if (m.role == "assistant" && pending_reasoning) m.reasoning_content = std::exchange(pending_reasoning, std::nullopt);
      out.push_back(std::move(m));
    } else if (type == "function_call") {
      ToolCall call;
      call.id = required_string(it, "call_id", p);
      call.name = required_string(it, "name", p);
      call.arguments_json = string_field(it, "arguments", p + ".arguments").value_or("{}");
      if (auto path = json_nesting_violation(call.arguments_json))
        throw ApiError(400, json_nesting_message("Invalid '" + p + ".arguments'", *path), p + ".arguments", "invalid_value");
      call_names[call.id] = call.name;
      // Calls join the assistant turn just before them (its text, or earlier calls).
      const bool join = !out.empty() && out.back().role == "assistant" && !pending_reasoning &&
                        (was_call || out.back().tool_calls.empty());
      if (!join) {
        ChatMessage m;
        m.role = "assistant";
        if (pending_reasoning) m.reasoning_content = std::exchange(pending_reasoning, std::nullopt);
        out.push_back(std::move(m));
      }
      out.back().tool_calls.push_back(std::move(call));
      last_was_call = true;
    } else if (type == "function_call_output") {
      if (pending_reasoning) reasoning_unclaimed();
      ChatMessage m;
      m.role = "tool";
      m.tool_call_id = required_string(it, "call_id", p);
      const json* o = json_field(it, "output");
      if (!o) missing(p + ".output");
      m.content = text_of(*o, p + ".output", {"input_text", "output_text", "text"});
      if (auto n = call_names.find(m.tool_call_id); n != call_names.end()) m.name = n->second;
      out.push_back(std::move(m));
    } else if (type == "reasoning") {
      std::string t = reasoning_text(it, p);
      if (!pending_reasoning) reasoning_at = p;
      pending_reasoning = pending_reasoning ? *pending_reasoning + "\n" + t : t;
    } else if (type == "item_reference") {
      bad_value(p + ".type", "Invalid '" + p + "': item_reference needs stored responses, which this server does not keep; "
                             "send the item itself.");
    } else {
      bad_value(p + ".type", "Unsupported input item type '" + type + "' in '" + p +
                                 "': this server accepts message, function_call, function_call_output and reasoning items.");
    }
  }
  if (pending_reasoning) reasoning_unclaimed();
  return out;
}

void parse_tools(const json& body, ResponsesRequest& r) {
  CompletionRequest& req = r.req;
  if (const json* tools = json_field(body, "tools")) {
    if (!tools->is_array()) bad_type("tools", *tools, "an array");
    json out = json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string p = at("tools", i);
      if (!t.is_object()) bad_type(p, t, "an object");
      const std::string type = required_string(t, "type", p);
      if (type != "function")
        bad_value(p + ".type", "Unsupported tool type '" + type + "' in '" + p + "': this server runs function tools only.");
      json fn = {{"name", required_string(t, "name", p)}};
      if (auto d = string_field(t, "description", p + ".description")) fn["description"] = *d;
      if (const json* params = json_field(t, "parameters")) {
        if (!params->is_object()) bad_type(p + ".parameters", *params, "an object");
        fn["parameters"] = *params;
      }
      out.push_back(json{{"type", "function"}, {"function", std::move(fn)}});
    }
    req.tools = std::move(out);
    r.echo["tools"] = *tools;
  }
  if (const json* tc = json_field(body, "tool_choice")) {
    if (tc->is_string()) {
      const std::string s = tc->get<std::string>();
      if (s != "none" && s != "auto" && s != "required")
        bad_value("tool_choice", "Invalid value for 'tool_choice': '" + s + "'. Supported values are: 'none', 'auto', and 'required'.");
      req.tool_choice = s;
    } else if (tc->is_object()) {
      const std::string type = required_string(*tc, "type", "tool_choice");
      if (type != "function")
        bad_value("tool_choice.type", "Unsupported 'tool_choice.type': '" + type + "'; use 'function' with a name.");
      req.tool_choice = "function";
      req.tool_choice_name = required_string(*tc, "name", "tool_choice");
    } else {
      bad_type("tool_choice", *tc, "a string or an object");
    }
    r.echo["tool_choice"] = *tc;
  }
}

}  // namespace

ResponsesRequest parse_responses_request(const json& body) {
  ResponsesRequest r;
  CompletionRequest& req = r.req;
  req.chat = true;
  req.model = string_field(body, "model", "model").value_or("");
  if (json_field(body, "previous_response_id"))
    bad_value("previous_response_id", "'previous_response_id' is not supported: this server stores no responses; send the "
                                      "whole conversation in 'input'.");
  if (json_field(body, "conversation"))
    bad_value("conversation", "'conversation' is not supported: this server stores no conversations; send the whole "
                              "conversation in 'input'.");
  if (boolean_field(body, "store").value_or(false))
    bad_value("store", "'store': true is not supported: this server stores no responses; send \"store\": false or omit it.");
  if (boolean_field(body, "background").value_or(false))
    bad_value("background", "'background': true is not supported by this server.");
  const std::optional<std::string> instructions = string_field(body, "instructions", "instructions");
  if (instructions) req.messages.push_back(ChatMessage{"system", *instructions, "", "", {}, std::nullopt});
  const json* input = json_field(body, "input");
  if (!input) missing("input");
  for (auto& m : parse_input(*input)) req.messages.push_back(std::move(m));
  if (req.messages.empty() || req.messages.back().role == "assistant")
    bad_value("input", "Invalid 'input': the last item is the assistant's; end with a user message or a function_call_output.");
  req.max_tokens = integer_in(body, "max_output_tokens", 1, kMaxTokensLimit);
  req.max_tokens_param = "max_output_tokens";  // budget errors name the field the client sent
  // Per-request LoRA selection, as chat/completions ("id", "a+b", "none"); `model` may also name an
  // adapter (resolve_model).
  req.adapter = string_field(body, "adapter", "adapter");
  req.sampling.temperature = number_in(body, "temperature", 0, 2);
  req.sampling.top_p = number_in(body, "top_p", 0, 1);
  // Log-probabilities are not produced on this route (chat/completions has them): refused, not ignored.
  if (integer_in(body, "top_logprobs", 0, 20).value_or(0) > 0)
    bad_value("top_logprobs", "'top_logprobs' is not supported on /v1/responses by this server; use /v1/chat/completions "
                              "with logprobs.");
  if (const json* inc = json_field(body, "include")) {
    if (!inc->is_array()) bad_type("include", *inc, "an array");
    for (size_t i = 0; i < inc->size(); ++i)
      if ((*inc)[i].is_string() && (*inc)[i].get<std::string>() == "message.output_text.logprobs")
        bad_value(at("include", i), "'message.output_text.logprobs' is not supported on /v1/responses by this server; "
                                    "use /v1/chat/completions with logprobs.");
  }
  parse_tools(body, r);
  if (const json* text = json_field(body, "text")) {
    if (!text->is_object()) bad_type("text", *text, "an object");
    if (const json* f = json_field(*text, "format")) {
      if (!f->is_object()) bad_type("text.format", *f, "an object");
      const std::string type = string_field(*f, "type", "text.format.type").value_or("text");
      if (type == "json_object" || type == "json_schema") {
        // Structured outputs: the Responses form is flat ({"type", "name", "schema", "strict"}).
        json rf = {{"type", type}};
        if (type == "json_schema") {
          json js = json::object();
          for (const char* k : {"name", "schema", "strict", "description"})
            if (f->contains(k)) js[k] = (*f)[k];
          rf["json_schema"] = std::move(js);
        }
        try {
          parse_response_format(json{{"response_format", std::move(rf)}}, req);
        } catch (const ApiError& e) {
          // The message names the chat form's fields; the client sent text.format.
          std::string msg = e.what();
          for (const std::string from : {"response_format.json_schema.", "response_format."}) {
            for (size_t at = msg.find(from); at != std::string::npos; at = msg.find(from, at))
              msg.replace(at, from.size(), "text.format.");
          }
          throw ApiError(e.status(), msg, "text.format", e.code());
        }
      } else if (type != "text") {
        bad_value("text.format.type", "Unsupported 'text.format.type': '" + type +
                                          "'; supported: 'text', 'json_object', 'json_schema'.");
      }
    }
  }
  if (const json* reasoning = json_field(body, "reasoning")) {
    if (!reasoning->is_object()) bad_type("reasoning", *reasoning, "an object");
    if (auto effort = string_field(*reasoning, "effort", "reasoning.effort"))
      req.chat_template_kwargs["enable_thinking"] = *effort != "none";
  }
  req.stream = boolean_field(body, "stream").value_or(false);
  r.echo["instructions"] = instructions ? json(*instructions) : json();
  r.echo["max_output_tokens"] = req.max_tokens ? json(*req.max_tokens) : json();
  r.echo["temperature"] = req.sampling.temperature ? json(*req.sampling.temperature) : json();
  r.echo["top_p"] = req.sampling.top_p ? json(*req.sampling.top_p) : json();
  if (!r.echo.contains("tool_choice")) r.echo["tool_choice"] = "auto";
  if (!r.echo.contains("tools")) r.echo["tools"] = json::array();
  r.echo["parallel_tool_calls"] = boolean_field(body, "parallel_tool_calls").value_or(true);
  const json* md = json_field(body, "metadata");
  r.echo["metadata"] = md && md->is_object() ? *md : json::object();
  return r;
}

}  // namespace hearth::server
