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
  Gemma4,      // <|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>   (gemma4_tool_calls.cpp)
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

/// Guesses the format from chat-template text: "<|tool_call>" -> Gemma4, "<tool_call>" with "<function=" -> Xml,
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

/// The text that opens a tool call in `format` ("<tool_call>", "<|tool_call>", "<|python_tag|>";
/// "" for None). Used to end an unclosed thought at a tool call (chat/reasoning.h).
std::string tool_call_start_marker(ToolCallFormat format);

/// Gemma 4 (src/chat/gemma4_tool_calls.cpp): every `<|tool_call>call:NAME{…}<tool_call|>` in
/// `text` (a missing closing tag ends the call at the next `<|tool_call>` or the end). Values:
/// `<|"|>…<|"|>` strings verbatim, `{k:v,…}` objects (bare or quoted keys), `[v,…]` lists, other
/// scalars JSON-decoded when they parse (numbers, true/false, null), else kept as text (mlx-lm
/// tool_parsers/gemma4.py semantics). Nesting deeper than 64 or any other malformed call stays in
/// `content`, verbatim. Never throws.
ParsedToolCalls parse_gemma4_tool_calls(const std::string& text);
/// Streaming hold-back for Gemma 4: the offset of the first "<|tool_call>", else of a trailing
/// partial one, else text.size().
size_t gemma4_tool_call_holdback_start(const std::string& text);

/// Types one Qwen XML parameter value (src/chat/xml_param_value.cpp) from its JSON-schema type
/// as Qwen's reference parser (qwen3coder_tool_parser.py, vLLM's qwen3_coder) does: "null" (any
/// case) -> null for any type; no schema / no type / string, str, text, varchar, char, enum -> the
/// text; int*, uint*, long*, short*, unsigned* -> Python int() else the text; num*, float* ->
/// Python float(), integral values as ints (3.0 -> 3), inf/nan -> the text; boolean, bool, binary ->
/// true/false (any case), other text kept (the reference maps it to false); object, array, arr,
/// dict*, list* -> JSON, else a Python literal ('single quotes', True/False/None), else the text;
/// any other type -> a Python literal, else the text. `schema_type` is matched trimmed, lowercase.
nlohmann::ordered_json xml_param_value(const std::string& raw, const std::string& schema_type);

}  // namespace hearth::chat
