// OpenAI request JSON -> CompletionRequest, with OpenAI-style validation: every bad field is an
// ApiError(400) naming the field. Not the HTTP layer (server.h) and not generation defaults
// (unset fields stay unset; the engine applies the model's generation_config).
#pragma once
#include <nlohmann/json.hpp>

#include <string_view>

#include "server/engine.h"

namespace hearth::server {

/// Parses a request body (raw bytes) into JSON; an empty body, malformed JSON or a non-object ->
/// ApiError(400, code "invalid_json").
nlohmann::ordered_json parse_body(std::string_view body);

/// POST /v1/chat/completions body -> CompletionRequest (chat = true). Honours model, messages
/// (string or text-part content; an assistant's reasoning_content or reasoning string), max_tokens / max_completion_tokens (the latter wins), temperature
/// [0,2], top_p [0,1], top_k >= 0, min_p [0,1], seed, stop (string or list), repetition_penalty
/// (> 0), presence/frequency_penalty [-2,2], logit_bias ({"id": bias in [-100,100]}), n (1 only), stream, stream_options.include_usage,
/// logprobs + top_logprobs [0,20], tools, tool_choice (a forced call's parameters schemas are compiled: 400
/// when unsupported), adapter, chat_template_kwargs, response_format (server/structured_output.h). Explicit
/// nulls count as absent; unknown fields are ignored. Throws ApiError(400) naming the field.
CompletionRequest parse_chat_request(const nlohmann::ordered_json& body);

/// POST /v1/completions body -> CompletionRequest (chat = false). `prompt` must be a string;
/// `logprobs` is the legacy integer [0,5] (number of alternatives); `echo`, best_of > 1 and a
/// non-null `suffix` (as vLLM) are rejected; the other fields are as for chat. Throws ApiError(400) naming the field.
CompletionRequest parse_completion_request(const nlohmann::ordered_json& body);

}  // namespace hearth::server
