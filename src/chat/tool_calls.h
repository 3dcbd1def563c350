// Tool-call extraction from generated text for the common chat formats (Hermes/Qwen JSON in
// <tool_call> tags, Qwen3.5/MiniCPM XML parameters, Llama-3 JSON), format detection from a chat
// template, and a streaming hold-back helper. Not the tool-call prompt side (the chat template does
// that). Never throws on model output: anything malformed stays plain content.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hearth::chat {

enum class ToolCallFormat {
  None,        // template has no tool-call convention we know
  Hermes,      // <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>   (Qwen2.5/Qwen3, Hermes)
  Xml,         // <tool_call>\n<function=NAME>\n<parameter=KEY>\nvalue\n</parameter>\n</function>\n</tool_call>
  Llama3Json,  // [<|python_tag|>]{"name": ..., "parameters": {...}}
};

/// One OpenAI-style tool call; `arguments_json` is a JSON object text (Python json.dumps spacing,
/// keys in the order the model wrote them).
struct ToolCall {
  std::string id;  // "call_" + 8 lowercase hex digits, random
  std::string name;
  std::string arguments_json;
};

/// Generated text split into what the user sees and the calls the model made.
struct ParsedToolCalls {
  std::string content;  // text outside the recognised calls, trimmed of surrounding whitespace
  std::vector<ToolCall> calls;
};

/// Guesses the format from chat-template text: "<tool_call>" with "<function=" -> Xml,
/// "<tool_call>" -> Hermes, "<|python_tag|>" or Llama-3 headers with "parameters" -> Llama3Json.
ToolCallFormat detect_tool_call_format(const std::string& chat_template);

/// Parses `text` in `format`. `tools` (null or the OpenAI tools array given to the template) types
/// Xml parameter values: integer/number/boolean/object/array/null schemas are parsed as JSON, strings
/// kept verbatim (minus the one newline each side). Malformed calls are left in `content`.
ParsedToolCalls parse_tool_calls(const std::string& text, ToolCallFormat format,
                                 const nlohmann::ordered_json& tools = nullptr);

/// Streaming: the byte offset in `text` (generated so far) from which output must be held back
/// because a tool call may be starting there; text.size() when everything can be sent.
size_t tool_call_holdback_start(const std::string& text, ToolCallFormat format);

}  // namespace hearth::chat
