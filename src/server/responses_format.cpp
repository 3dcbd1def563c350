// OpenAI Response objects and `response.*` streaming events from native StreamEvents (see
// responses_api.h). Follows platform.openai.com's Responses reference. Not request parsing.
#include <mutex>
#include <random>

#include "server/openai_format.h"
#include "server/responses_api.h"

namespace hearth::server {
namespace {

// "call_<hex>" (the server's tool-call ids) -> "fc_<hex>" (the item id beside call_id).
std::string function_item_id(const std::string& call_id) {
  return "fc_" + (call_id.rfind("call_", 0) == 0 ? call_id.substr(5) : call_id);
}

ojson function_call_item(const ToolCall& c, const std::string& status, bool with_args) {
  return ojson{{"type", "function_call"},        {"id", function_item_id(c.id)},
               {"call_id", c.id},                {"name", c.name},
               {"arguments", with_args ? c.arguments_json : ""}, {"status", status}};
}

ojson text_part(const std::string& text) {
  return ojson{{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
}

// "completed" / "incomplete" for kDone, and the incomplete_details.
std::pair<std::string, ojson> outcome(const StreamEvent& done) {
  if (done.finish_reason == "length") return {"incomplete", ojson{{"reason", "max_output_tokens"}}};
  if (done.finish_reason == "abort") return {"incomplete", ojson{{"reason", "cancelled"}}};
  return {"completed", nullptr};
}

}  // namespace

std::string new_responses_id(const char* prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  static const char* hex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id.push_back(hex[rng() & 15]);
  return id;
}

ojson ResponsesWriter::response(const std::string& status, ojson output, const StreamEvent* done) const {
  ojson r{{"id", id_},
          {"object", "response"},
          {"created_at", created_at_},
          {"status", status},
          {"error", nullptr},
          {"incomplete_details", done ? outcome(*done).second : ojson()},
          {"model", model_},
          {"output", std::move(output)}};
  for (const auto& [k, v] : echo_.items()) r[k] = v;
  r["previous_response_id"] = nullptr;
  r["store"] = false;
  r["text"] = ojson{{"format", {{"type", "text"}}}};
  r["truncation"] = "disabled";
  if (done) {
    r["usage"] = ojson{{"input_tokens", done->prompt_tokens},
                       {"input_tokens_details", {{"cached_tokens", done->cached_tokens}}},
                       {"output_tokens", done->completion_tokens},
                       {"output_tokens_details", {{"reasoning_tokens", done->reasoning_tokens}}},
                       {"total_tokens", done->prompt_tokens + done->completion_tokens}};
  } else {
    r["usage"] = nullptr;
  }
  return r;
}

ojson ResponsesWriter::item_json(const Item& it, const std::string& status) const {
  if (it.type == "reasoning")
    return ojson{{"type", "reasoning"},
                 {"id", it.id},
                 {"summary", ojson::array()},
                 {"content", ojson::array({ojson{{"type", "reasoning_text"}, {"text", it.text}}})}};
  return ojson{{"type", "message"}, {"id", it.id}, {"status", status}, {"role", "assistant"},
               {"content", ojson::array({text_part(it.text)})}};
}

std::string ResponsesWriter::full(const std::vector<StreamEvent>& deltas, const StreamEvent& done) {
  std::string text, reasoning;
  for (const auto& d : deltas) {
    text += d.text;
    reasoning += d.reasoning;
  }
  const auto [status, details] = outcome(done);
  ojson output = ojson::array();
  if (!reasoning.empty()) output.push_back(item_json(Item{"reasoning", new_responses_id("rs_"), reasoning}, status));
  if (!text.empty() || (done.tool_calls.empty() && reasoning.empty()))  // never an empty message beside other items
    output.push_back(item_json(Item{"message", new_responses_id("msg_"), text}, status));
  for (const auto& c : done.tool_calls) output.push_back(function_call_item(c, "completed", true));
  return dump_json(response(status, std::move(output), &done));
}

std::string ResponsesWriter::ev(ojson data) {
  data["sequence_number"] = seq_++;
  return "event: " + data.at("type").get<std::string>() + "\ndata: " + dump_json(data) + "\n\n";
}

std::string ResponsesWriter::begin(const StreamEvent&) {
  std::string out = ev(ojson{{"type", "response.created"}, {"response", response("in_progress", ojson::array(), nullptr)}});
  return out + ev(ojson{{"type", "response.in_progress"}, {"response", response("in_progress", ojson::array(), nullptr)}});
}

std::string ResponsesWriter::close(const std::string& status) {
  if (!open_) return {};
  open_ = false;
  const Item& it = items_.back();
  const size_t index = items_.size() - 1;
  const bool reasoning = it.type == "reasoning";
  const ojson part = reasoning ? ojson{{"type", "reasoning_text"}, {"text", it.text}} : text_part(it.text);
  std::string out = ev(ojson{{"type", reasoning ? "response.reasoning_text.done" : "response.output_text.done"},
                             {"item_id", it.id},
                             {"output_index", index},
                             {"content_index", 0},
                             {"text", it.text}});
  out += ev(ojson{{"type", "response.content_part.done"}, {"item_id", it.id}, {"output_index", index}, {"content_index", 0},
                  {"part", part}});
  return out + ev(ojson{{"type", "response.output_item.done"}, {"output_index", index}, {"item", item_json(it, status)}});
}

std::string ResponsesWriter::open(const char* type) {
  if (open_ && items_.back().type == type) return {};
  std::string out = close();
  const bool reasoning = std::string(type) == "reasoning";
  items_.push_back(Item{type, new_responses_id(reasoning ? "rs_" : "msg_"), ""});
  open_ = true;
  const size_t index = items_.size() - 1;
  ojson item = item_json(items_.back(), "in_progress");
  item["content"] = ojson::array();
  out += ev(ojson{{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
  const ojson part = reasoning ? ojson{{"type", "reasoning_text"}, {"text", ""}} : text_part("");
  return out + ev(ojson{{"type", "response.content_part.added"}, {"item_id", items_.back().id}, {"output_index", index},
                        {"content_index", 0}, {"part", part}});
}

std::string ResponsesWriter::delta(const StreamEvent& d) {
  std::string out;
  for (const bool reasoning : {true, false}) {
    const std::string& piece = reasoning ? d.reasoning : d.text;
    if (piece.empty()) continue;
    out += open(reasoning ? "reasoning" : "message");
    items_.back().text += piece;
    ojson e{{"type", reasoning ? "response.reasoning_text.delta" : "response.output_text.delta"},
            {"item_id", items_.back().id},
            {"output_index", items_.size() - 1},
            {"content_index", 0},
            {"delta", piece}};
    if (!reasoning) e["logprobs"] = ojson::array();
    out += ev(std::move(e));
  }
  return out;
}

std::string ResponsesWriter::end(const StreamEvent& done) {
  const auto [status, details] = outcome(done);
  std::string out;
  if (items_.empty() && done.tool_calls.empty()) out += open("message");  // as full(): an empty message only alone
  out += close(status);
  ojson output = ojson::array();
  for (const auto& it : items_) output.push_back(item_json(it, status));
  for (const auto& c : done.tool_calls) {
    const size_t index = output.size();
    out += ev(ojson{{"type", "response.output_item.added"}, {"output_index", index}, {"item", function_call_item(c, "in_progress", false)}});
    out += ev(ojson{{"type", "response.function_call_arguments.delta"}, {"item_id", function_item_id(c.id)},
                    {"output_index", index}, {"delta", c.arguments_json}});
    out += ev(ojson{{"type", "response.function_call_arguments.done"}, {"item_id", function_item_id(c.id)},
                    {"output_index", index}, {"name", c.name}, {"arguments", c.arguments_json}});
    output.push_back(function_call_item(c, "completed", true));
    out += ev(ojson{{"type", "response.output_item.done"}, {"output_index", index}, {"item", output.back()}});
  }
  const char* type = status == "completed" ? "response.completed" : "response.incomplete";
  return out + ev(ojson{{"type", type}, {"response", response(status, std::move(output), &done)}});
}

std::string ResponsesWriter::error(const StreamEvent& e) {
  return ev(ojson{{"type", "error"},
                  {"code", e.code.empty() ? ojson(e.status >= 500 ? "server_error" : "invalid_request_error") : ojson(e.code)},
                  {"message", e.message},
                  {"param", e.param.empty() ? ojson() : ojson(e.param)}});
}

}  // namespace hearth::server
