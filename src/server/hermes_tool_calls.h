// A small parser for Hermes-format tool calls (`<tool_call>{json}</tool_call>`, used by Qwen and
// many Llama fine-tunes) so the server's tool path works before src/chat/ has its per-format
// parsers. Not a streaming parser: it runs once on the held-back text at the end of generation.
#pragma once
#include <string>
#include <string_view>

#include "server/engine.h"

namespace hearth::server {

/// Finds every `<tool_call>` ... `</tool_call>` block in `text` (a missing final close tag is
/// tolerated: the block runs to the end). Each block must hold a JSON object with a string
/// "name" and optional "arguments" (object, or a string holding JSON); such blocks become
/// ToolCalls with fresh ids and arguments re-serialized compactly. Blocks that do not parse are
/// kept, tags included, in `content` with the text around them (trimmed). Never throws.
ParsedToolCalls parse_hermes_tool_calls(std::string_view text);

/// A fresh OpenAI-style tool call id: "call_" + 24 random hex digits.
std::string new_tool_call_id();

}  // namespace hearth::server
