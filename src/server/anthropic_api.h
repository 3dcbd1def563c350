// Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens) at the server edge:
// request JSON -> CompletionRequest, native events -> Message objects / SSE events, and errors in
// Anthropic's shape. Follows docs.anthropic.com "Messages" and "Streaming Messages". Not transport.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "server/response_writer.h"

namespace hearth::server {

/// POST /v1/messages body -> CompletionRequest (chat). Maps: `system` (string or text blocks,
/// joined by "\n") -> a first system message; `messages[i].content` (string or blocks): `text`
/// (joined by "\n"), assistant `tool_use` {id, name, input} -> tool_calls, user `tool_result`
/// {tool_use_id, content: string | text blocks} -> a "tool" message (its name from the matching
/// tool_use), assistant `thinking` -> reasoning_content (`redacted_thinking` is dropped: it is
/// opaque); `max_tokens` (required unless `count_only`), `stop_sequences`, `temperature` [0,1],
/// `top_p` [0,1], `top_k` >= 0, `tools` [{name, description, input_schema}] -> OpenAI tools,
/// `tool_choice` {auto | any -> "required" | tool -> its name | none}, `thinking` {type: enabled |
/// adaptive | disabled} -> chat_template_kwargs.enable_thinking, `stream`; `seed` (any int64: not
/// in Anthropic's API, an extension seeding the sampler as chat/completions' `seed` does); `metadata`,
/// `cache_control` and unknown fields are ignored. A last message from the assistant (prefill)
/// and image/document blocks and server tools are refused. Throws ApiError(400) naming the field.
CompletionRequest parse_anthropic_request(const nlohmann::ordered_json& body, bool count_only);

/// A fresh message id: "msg_" + 24 random hex digits.
std::string new_anthropic_message_id();

/// Anthropic's error `type` for an HTTP status: 400 invalid_request_error, 401
/// authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 429
/// rate_limit_error, 503/529 overloaded_error, other 5xx api_error, other 4xx invalid_request_error.
std::string anthropic_error_type(int status);
/// {"type": "error", "error": {"type", "message"}}.
nlohmann::ordered_json anthropic_error_json(int status, const std::string& message);

/// Message stop_reason for a kDone event: "tool_use" (tool calls), "max_tokens" (length),
/// "stop_sequence" (a stop string matched), "pause_turn" (cut by shutdown: the turn may be
/// resent to continue; never claimed complete), else "end_turn".
std::string anthropic_stop_reason(const StreamEvent& done);

/// The ResponseWriter of /v1/messages. Non-streaming: a Message {id, type, role, model, content:
/// [thinking?, text?, tool_use*], stop_reason, stop_sequence, usage}; a text block is present when
/// there is text, or neither thinking nor a tool call (an empty one then). Streaming: message_start, ping, then per block
/// content_block_start / content_block_delta (thinking_delta, text_delta, input_json_delta) /
/// content_block_stop, then message_delta (stop_reason, usage) and message_stop; an error mid-stream
/// is an `error` event. usage follows Anthropic: input_tokens excludes cache_read_input_tokens.
class AnthropicWriter : public ResponseWriter {
 public:
  AnthropicWriter(std::string id, std::string model) : id_(std::move(id)), model_(std::move(model)) {}
  std::string full(const std::vector<StreamEvent>& deltas, const StreamEvent& done) override;
  std::string begin(const StreamEvent& started) override;
  std::string delta(const StreamEvent& d) override;
  std::string end(const StreamEvent& done) override;
  std::string error(const StreamEvent& e) override;

 private:
  std::string open(const char* type);  // closes the open block if another type, opens `type`
  std::string close();

  std::string id_, model_;
  int index_ = -1;         // index of the last block started
  std::string open_type_;  // "" | "thinking" | "text"
};

}  // namespace hearth::server
