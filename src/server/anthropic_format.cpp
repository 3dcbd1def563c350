// Anthropic Message objects and streaming events from native StreamEvents (see anthropic_api.h).
// Follows docs.anthropic.com "Messages" / "Streaming Messages". Not request parsing.
#include <mutex>
#include <random>

#include "server/anthropic_api.h"
#include "server/openai_format.h"

namespace hearth::server {
namespace {

// "event: <type>\ndata: <json>\n\n".
std::string event(const ojson& data) { return "event: " + data.at("type").get<std::string>() + "\n" + "data: " + dump_json(data) + "\n\n"; }

// "call_<hex>" (the server's tool-call ids) -> "toolu_<hex>"; other ids are kept.
std::string tool_use_id(const std::string& id) { return id.rfind("call_", 0) == 0 ? "toolu_" + id.substr(5) : id; }

// A tool call's arguments as the `input` object ({} when the model's text is not a JSON object).
ojson tool_input(const ToolCall& c) {
  ojson v = ojson::parse(c.arguments_json, nullptr, /*allow_exceptions=*/false);
  return v.is_object() ? v : ojson::object();
}

ojson tool_use_block(const ToolCall& c, bool with_input) {
  return ojson{{"type", "tool_use"}, {"id", tool_use_id(c.id)}, {"name", c.name}, {"input", with_input ? tool_input(c) : ojson::object()}};
}

ojson usage(const StreamEvent& done) {
  return ojson{{"input_tokens", done.prompt_tokens - done.cached_tokens},
               {"cache_creation_input_tokens", 0},
               {"cache_read_input_tokens", done.cached_tokens},
               {"output_tokens", done.completion_tokens}};
}

ojson stop_sequence_json(const StreamEvent& done) {
  return done.stop_sequence.empty() || anthropic_stop_reason(done) != "stop_sequence" ? ojson() : ojson(done.stop_sequence);
}

}  // namespace

std::string new_anthropic_message_id() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  static const char* hex = "0123456789abcdef";
  std::string id = "msg_";
  for (int i = 0; i < 24; ++i) id.push_back(hex[rng() & 15]);
  return id;
}

std::string anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

ojson anthropic_error_json(int status, const std::string& message) {
  return ojson{{"type", "error"}, {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
}

std::string anthropic_stop_reason(const StreamEvent& done) {
  if (done.finish_reason == "tool_calls") return "tool_use";
  if (done.finish_reason == "length") return "max_tokens";
  if (done.finish_reason == "abort") return "pause_turn";
  if (!done.stop_sequence.empty()) return "stop_sequence";
  return "end_turn";
}

std::string AnthropicWriter::full(const std::vector<StreamEvent>& deltas, const StreamEvent& done) {
  std::string text, reasoning;
  for (const auto& d : deltas) {
    text += d.text;
    reasoning += d.reasoning;
  }
  ojson content = ojson::array();
  if (!reasoning.empty()) content.push_back(ojson{{"type", "thinking"}, {"thinking", reasoning}, {"signature", ""}});
  if (!text.empty() || (done.tool_calls.empty() && reasoning.empty()))  // an empty text block only alone
    content.push_back(ojson{{"type", "text"}, {"text", text}});
  for (const auto& c : done.tool_calls) content.push_back(tool_use_block(c, true));
  return dump_json(ojson{{"id", id_},
                         {"type", "message"},
                         {"role", "assistant"},
                         {"model", model_},
                         {"content", content},
                         {"stop_reason", anthropic_stop_reason(done)},
                         {"stop_sequence", stop_sequence_json(done)},
                         {"usage", usage(done)}});
}

std::string AnthropicWriter::begin(const StreamEvent& started) {
  ojson msg{{"id", id_},
            {"type", "message"},
            {"role", "assistant"},
            {"model", model_},
            {"content", ojson::array()},
            {"stop_reason", nullptr},
            {"stop_sequence", nullptr},
            {"usage", {{"input_tokens", started.prompt_tokens},
                       {"cache_creation_input_tokens", 0},
                       {"cache_read_input_tokens", 0},
                       {"output_tokens", 0}}}};
  return event(ojson{{"type", "message_start"}, {"message", msg}}) + event(ojson{{"type", "ping"}});
}

std::string AnthropicWriter::close() {
  if (open_type_.empty()) return {};
  open_type_.clear();
  return event(ojson{{"type", "content_block_stop"}, {"index", index_}});
}

std::string AnthropicWriter::open(const char* type) {
  if (open_type_ == type) return {};
  std::string out = close();
  open_type_ = type;
  ++index_;
  ojson block = open_type_ == "thinking" ? ojson{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                         : ojson{{"type", "text"}, {"text", ""}};
  return out + event(ojson{{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
}

std::string AnthropicWriter::delta(const StreamEvent& d) {
  std::string out;
  if (!d.reasoning.empty()) {
    out += open("thinking");  // before reading index_: it may start a block
    out += event(ojson{{"type", "content_block_delta"},
                       {"index", index_},
                       {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
  }
  if (!d.text.empty()) {
    out += open("text");
    out += event(ojson{{"type", "content_block_delta"}, {"index", index_}, {"delta", {{"type", "text_delta"}, {"text", d.text}}}});
  }
  return out;
}

std::string AnthropicWriter::end(const StreamEvent& done) {
  std::string out;
  if (index_ < 0 && done.tool_calls.empty()) out += open("text");  // as full(): an empty text block only alone
  out += close();
  for (const auto& c : done.tool_calls) {
    ++index_;
    out += event(ojson{{"type", "content_block_start"}, {"index", index_}, {"content_block", tool_use_block(c, false)}});
    out += event(ojson{{"type", "content_block_delta"},
                       {"index", index_},
                       {"delta", {{"type", "input_json_delta"}, {"partial_json", dump_json(tool_input(c))}}}});
    out += event(ojson{{"type", "content_block_stop"}, {"index", index_}});
  }
  ojson u = usage(done);
  out += event(ojson{{"type", "message_delta"},
                     {"delta", {{"stop_reason", anthropic_stop_reason(done)}, {"stop_sequence", stop_sequence_json(done)}}},
                     {"usage", u}});
  return out + event(ojson{{"type", "message_stop"}});
}

std::string AnthropicWriter::error(const StreamEvent& e) { return event(anthropic_error_json(e.status, e.message)); }

}  // namespace hearth::server
