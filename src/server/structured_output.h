// Structured outputs for the server: OpenAI `response_format` (text, json_object, json_schema)
// and forced tool calls (tool_choice "required" or a named function) compiled into grammars at
// parse time (bad schemas are 400s before queueing), and the per-request token constraint the
// sampler applies. Not the grammar machinery (src/grammar/) nor the sampler (src/generate/).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "chat/tool_calls.h"
#include "generate/constraint.h"
#include "server/engine.h"

namespace hearth::tokenizer {
class Tokenizer;
}

namespace hearth::server {

/// Parses the request body's `response_format` into req.response_format / req.response_grammar:
/// absent, null or {"type": "text"} → none; {"type": "json_object"} → any JSON object;
/// {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}} → the
/// schema's grammar (grammar/json_schema.h lists the supported keywords). Throws ApiError(400,
/// param "response_format") for another type, a malformed object or an unsupported schema feature
/// (the message names the keyword and its path).
void parse_response_format(const nlohmann::ordered_json& body, CompletionRequest& req);

/// The grammar of a forced tool call in `format` (Hermes: <tool_call>{"name": .., "arguments":
/// {..}}</tool_call>; Llama3Json: {"name": .., "parameters": {..}}), arguments constrained by
/// the tool's `parameters` schema; nullptr when the request forces none. Throws ApiError(400):
/// param "tool_choice" for a name not in tools or a format that cannot be constrained (Xml,
/// Gemma4), param "tools" for an unsupported parameters schema.
std::shared_ptr<const grammar::Grammar> tool_call_grammar(const CompletionRequest& req, chat::ToolCallFormat format);

/// Throws what make_constraint would for this request and format (the engine calls it in
/// prepare(), on the HTTP thread, so the client gets a 400 before queueing).
void check_structured_output(const CompletionRequest& req, chat::ToolCallFormat format);

/// The constraint for one generation (nullptr when the request has neither a response_format
/// grammar nor a forced tool call; a forced tool call wins). The tokenizer's vocabulary trie is
/// built on first use and kept (per tokenizer and EOS set), and automata with their memoized
/// masks are shared by requests with the same grammar (a small LRU). Throws like
/// check_structured_output.
std::shared_ptr<generate::TokenConstraint> make_constraint(const CompletionRequest& req, const tokenizer::Tokenizer& tok,
                                                           const std::vector<int64_t>& eos_ids,
                                                           chat::ToolCallFormat format);

}  // namespace hearth::server
