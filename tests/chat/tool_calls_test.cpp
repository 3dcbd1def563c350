// Tests of tool-call parsing: Hermes JSON, XML parameters typed by the tool schema, Llama-3 JSON,
// malformed input kept as content, format detection and streaming hold-back.
#include <gtest/gtest.h>

#include <regex>

#include "chat/tool_calls.h"

using hearth::chat::ToolCallFormat;
using hearth::chat::parse_tool_calls;
using nlohmann::ordered_json;

TEST(ToolCalls, HermesSeveralCalls) {
  std::string text =
      "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"é\"}}\n</tool_call>";
  auto r = parse_tool_calls(text, ToolCallFormat::Hermes);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "Let me check.");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments_json, "{\"city\": \"Paris\", \"days\": 2}");
  EXPECT_EQ(r.calls[1].arguments_json, "{\"query\": \"é\"}");
  EXPECT_TRUE(std::regex_match(r.calls[0].id, std::regex("call_[0-9a-f]{8}")));
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
}

TEST(ToolCalls, HermesUnclosedAndMalformed) {
  auto r = parse_tool_calls("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n", ToolCallFormat::Hermes);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments_json, "{}");
  EXPECT_EQ(r.content, "");
  std::string bad = "Hi <tool_call>{\"name\": oops}</tool_call>";
  r = parse_tool_calls(bad, ToolCallFormat::Hermes);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, bad);
  r = parse_tool_calls("<tool_call>{\"arguments\": {}}</tool_call>", ToolCallFormat::Hermes);  // no name
  EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCalls, XmlParametersFollowSchema) {
  ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
      "metric": {"type": "boolean"}, "opts": {"type": "object"}, "note": {"type": ["string", "null"]}}}}}])");
  std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=opts>\n{\"a\": [1]}\n</parameter>\n"
      "<parameter=note>\n42\n</parameter>\n</function>\n</tool_call>";
  auto r = parse_tool_calls(text, ToolCallFormat::Xml, tools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments_json,
            "{\"city\": \"New York\", \"days\": 3, \"metric\": true, \"opts\": {\"a\": [1]}, \"note\": \"42\"}");
  r = parse_tool_calls("<tool_call>\n<function=f>\n<parameter=x>\n\nline1\nline2\n\n</parameter>\n</function>\n</tool_call>",
                       ToolCallFormat::Xml, nullptr);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments_json, "{\"x\": \"\\nline1\\nline2\\n\"}");
  // A value without </parameter> ends at the next tag (here </function>), as vLLM's parser does.
  r = parse_tool_calls("<tool_call>\n<function=f>\n<parameter=x>\nno end</function>\n</tool_call>", ToolCallFormat::Xml);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments_json, "{\"x\": \"no end\"}");
  r = parse_tool_calls("<tool_call>\n<function=f>\n<parameter=x>\n</function>\n</tool_call>", ToolCallFormat::Xml);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments_json, "{\"x\": \"\"}");
}

TEST(ToolCalls, XmlNullAndUnclosedParameters) {
  ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}}}])");
  // "null" is JSON null whether or not the schema knows the parameter (vLLM qwen3coder).
  auto r = parse_tool_calls(
      "<tool_call>\n<function=f>\n<parameter=n>\nnull\n</parameter>\n<parameter=extra>\nnull\n</parameter>\n"
      "<parameter=other>\nNULL\n</parameter>\n<parameter=s>\ntext\n</parameter>\n</function>\n</tool_call>",
      ToolCallFormat::Xml, tools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments_json, "{\"n\": null, \"extra\": null, \"other\": null, \"s\": \"text\"}");
  // A missing </parameter> ends the value at the next <parameter=, which is parsed normally.
  r = parse_tool_calls(
      "<tool_call>\n<function=f>\n<parameter=s>\nfirst\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>",
      ToolCallFormat::Xml, tools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments_json, "{\"s\": \"first\", \"n\": 7}");
}

TEST(ToolCalls, HermesClosingTagInsideAJsonStringDoesNotEndTheCall) {
  std::string text =
      "<tool_call>\n{\"name\": \"write\", \"arguments\": {\"text\": \"use </tool_call> to close, and \\\"quotes\\\"\"}}\n"
      "</tool_call>\nDone.";
  auto r = parse_tool_calls(text, ToolCallFormat::Hermes);
  ASSERT_EQ(r.calls.size(), 1u) << r.content;
  EXPECT_EQ(r.calls[0].name, "write");
  EXPECT_EQ(r.calls[0].arguments_json, "{\"text\": \"use </tool_call> to close, and \\\"quotes\\\"\"}");
  EXPECT_EQ(r.content, "Done.");
  // Two calls, the first with the tag in a string: both found.
  r = parse_tool_calls(
      "<tool_call>{\"name\": \"a\", \"arguments\": {\"t\": \"<tool_call>x</tool_call>\"}}</tool_call>"
      "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>",
      ToolCallFormat::Hermes);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments_json, "{\"t\": \"<tool_call>x</tool_call>\"}");
  EXPECT_EQ(r.calls[1].name, "b");
}

TEST(ToolCalls, DeeplyNestedArgumentsStayContent) {
  const std::string deep = std::string(15000, '[') + std::string(15000, ']');
  std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": " + deep + "}}</tool_call>";
  auto r = parse_tool_calls(text, ToolCallFormat::Hermes);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, text);
  r = parse_tool_calls("{\"name\": \"f\", \"parameters\": {\"x\": " + deep + "}}", ToolCallFormat::Llama3Json);
  EXPECT_TRUE(r.calls.empty());
  // Arguments given as a JSON string are parsed with the same bound.
  r = parse_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": \"" + deep + "\"}</tool_call>", ToolCallFormat::Hermes);
  EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCalls, Llama3Json) {
  auto r = parse_tool_calls("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", ToolCallFormat::Llama3Json);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments_json, "{\"city\": \"Paris\"}");
  EXPECT_EQ(r.content, "");
  r = parse_tool_calls("<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}",
                       ToolCallFormat::Llama3Json);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "b");
  r = parse_tool_calls("The answer is {not json}", ToolCallFormat::Llama3Json);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "The answer is {not json}");
  r = parse_tool_calls("{\"a\": 1}", ToolCallFormat::Llama3Json);
  EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCalls, DetectFormat) {
  EXPECT_EQ(hearth::chat::detect_tool_call_format("{{ '<tool_call>\\n<function=' }}"), ToolCallFormat::Xml);
  EXPECT_EQ(hearth::chat::detect_tool_call_format("<tool_call>\\n{\"name\""), ToolCallFormat::Hermes);
  EXPECT_EQ(hearth::chat::detect_tool_call_format("{{- '<|python_tag|>' }}"), ToolCallFormat::Llama3Json);
  EXPECT_EQ(hearth::chat::detect_tool_call_format("<start_of_turn>"), ToolCallFormat::None);
}

TEST(ToolCalls, StreamingHoldback) {
  using hearth::chat::tool_call_holdback_start;
  EXPECT_EQ(tool_call_holdback_start("Hello <tool", ToolCallFormat::Hermes), 6u);
  EXPECT_EQ(tool_call_holdback_start("Hello <tool_call>{\"na", ToolCallFormat::Hermes), 6u);
  EXPECT_EQ(tool_call_holdback_start("Hello <b>", ToolCallFormat::Hermes), 9u);
  EXPECT_EQ(tool_call_holdback_start("Hi <|pyth", ToolCallFormat::Llama3Json), 3u);
  EXPECT_EQ(tool_call_holdback_start(" {\"name\"", ToolCallFormat::Llama3Json), 0u);
  EXPECT_EQ(tool_call_holdback_start("Sure", ToolCallFormat::Llama3Json), 4u);
  EXPECT_EQ(tool_call_holdback_start("abc <", ToolCallFormat::None), 5u);
}
