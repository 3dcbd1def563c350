// OpenAI Responses API (POST /v1/responses) at the server edge: request JSON -> CompletionRequest
// plus the fields a Response object echoes, and native events -> Response objects / `response.*`
// SSE events. Follows platform.openai.com's Responses reference. Not transport; nothing is stored.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "server/response_writer.h"

namespace hearth::server {

/// A parsed /v1/responses request.
struct ResponsesRequest {
  CompletionRequest req;
  /// Request fields the Response object repeats: instructions, max_output_tokens, temperature,
  /// top_p, tool_choice, tools, parallel_tool_calls, metadata (null when not sent).
  nlohmann::ordered_json echo = nlohmann::ordered_json::object();
};

/// POST /v1/responses body -> ResponsesRequest. `input`: a string (one user message) or items:
/// messages {role user|assistant|system|developer, content string | parts input_text/output_text
/// (concatenated)}, `function_call` {call_id, name, arguments} (-> the assistant's tool_calls),
/// `function_call_output` {call_id, output} (-> a "tool" message), `reasoning` (its text ->
/// the next assistant message's reasoning_content). `instructions` -> a first system message;
/// `tools` [{type: "function", name, description, parameters}]; `tool_choice` "none" | "auto" |
/// "required" | {type: "function", name}; `max_output_tokens`; `temperature` [0,2]; `top_p` [0,1];
/// `reasoning.effort` ("none" -> enable_thinking false, else true); `stream`. Refused with a 400
/// naming the field: `previous_response_id`, `store: true`, `background: true` (no response is
/// stored), `conversation`, `text.format` other than "text", images/files, item_reference items,
/// tool types other than "function". Unknown fields are ignored.
ResponsesRequest parse_responses_request(const nlohmann::ordered_json& body);

/// A fresh response id: "resp_" + 24 random hex digits (other item ids use the same scheme).
std::string new_responses_id(const char* prefix = "resp_");

/// The ResponseWriter of /v1/responses. A Response: {id, object: "response", created_at, status
/// ("completed"; "incomplete" with incomplete_details.reason "max_output_tokens" at the length
/// limit or "cancelled" when cut by shutdown), model, output: [reasoning?, message?,
/// function_call*], usage {input_tokens, input_tokens_details.cached_tokens, output_tokens,
/// output_tokens_details.reasoning_tokens (the output tokens generated inside a thought, its
/// markers included), total_tokens}, and the echoed fields}.
/// A message item is present when there is text, or neither reasoning nor a function call (an
/// empty one then). Streaming: response.created,
/// response.in_progress, then per item output_item.added / content_part.added /
/// output_text.delta (reasoning_text.delta for thoughts) / output_text.done / content_part.done /
/// output_item.done, function_call_arguments.delta/done for calls, and response.completed (or
/// response.incomplete); each event has `type` and `sequence_number` (from 0) and an SSE `event:`
/// line. An error mid-stream is an `error` event {code, message, param}.
class ResponsesWriter : public ResponseWriter {
 public:
  ResponsesWriter(std::string id, int64_t created_at, std::string model, nlohmann::ordered_json echo)
      : id_(std::move(id)), created_at_(created_at), model_(std::move(model)), echo_(std::move(echo)) {}
  std::string full(const std::vector<StreamEvent>& deltas, const StreamEvent& done) override;
  std::string begin(const StreamEvent& started) override;
  std::string delta(const StreamEvent& d) override;
  std::string end(const StreamEvent& done) override;
  std::string error(const StreamEvent& e) override;

 private:
  struct Item {
    std::string type;  // "reasoning" | "message"
    std::string id;
    std::string text;
  };
  nlohmann::ordered_json response(const std::string& status, nlohmann::ordered_json output, const StreamEvent* done) const;
  nlohmann::ordered_json item_json(const Item& it, const std::string& status) const;
  std::string ev(nlohmann::ordered_json data);  // one SSE event with the next sequence_number
  std::string open(const char* type);
  std::string close(const std::string& status = "completed");

  std::string id_;
  int64_t created_at_;
  std::string model_;
  nlohmann::ordered_json echo_;
  int64_t seq_ = 0;
  std::vector<Item> items_;  // streamed so far; the last is open when open_
  bool open_ = false;
};

}  // namespace hearth::server
