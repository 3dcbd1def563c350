// Tests of Gemma 4 tool-call parsing (<|tool_call>call:NAME{…}<tool_call|>): typed values, nested
// objects and lists, several calls, missing closing tags, malformed calls kept as content, a
// nesting bound, detection, hold-back, and streamed (through a hold-back router like the
// server's) = non-streamed on recorded outputs.
#include <gtest/gtest.h>

#include <random>

#include "chat/tool_calls.h"

using hearth::chat::parse_tool_calls;
using hearth::chat::ParsedToolCalls;
using hearth::chat::ToolCallFormat;

namespace {

const std::string Q = "<|\"|>";

ParsedToolCalls parse(const std::string& text) { return parse_tool_calls(text, ToolCallFormat::Gemma4); }

// What a client sees when `text` is streamed in `cuts` pieces through the server's router: the
// content sent before the hold-back point, then the parse of the held text at the end.
ParsedToolCalls streamed(const std::string& text, const std::vector<size_t>& cuts) {
  std::string routed, sent_content;
  size_t sent = 0, prev = 0;
  auto feed = [&](const std::string& piece) {
    routed += piece;
    size_t hold = std::max(sent, std::min(hearth::chat::tool_call_holdback_start(routed, ToolCallFormat::Gemma4), routed.size()));
    sent_content += routed.substr(sent, hold - sent);
    sent = hold;
  };
  for (size_t c : cuts) {
    feed(text.substr(prev, c - prev));
    prev = c;
  }
  feed(text.substr(prev));
  ParsedToolCalls held = parse(routed.substr(sent));
  if (held.calls.empty()) held.content = sent_content + routed.substr(sent);
  else held.content = sent_content + held.content;
  return held;
}

}  // namespace

TEST(Gemma4ToolCalls, TypedValuesNestedObjectsAndLists) {
  std::string text = "<|tool_call>call:get_weather{city:" + Q + "Paris, \"FR\" {x}" + Q +
                     ",days:3,metric:true,ratio:0.5,none:null,tags:[" + Q + "a" + Q + ",2,false],opts:{unit:" + Q +
                     "C" + Q + ",nested:{x:-1}},path:/tmp/x,big:1e3}<tool_call|>";
  auto r = parse(text);
  ASSERT_EQ(r.calls.size(), 1u) << r.content;
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments_json,
            "{\"city\": \"Paris, \\\"FR\\\" {x}\", \"days\": 3, \"metric\": true, \"ratio\": 0.5, \"none\": null, "
            "\"tags\": [\"a\", 2, false], \"opts\": {\"unit\": \"C\", \"nested\": {\"x\": -1}}, \"path\": \"/tmp/x\", "
            "\"big\": 1000.0}");
  EXPECT_EQ(r.content, "");
}

TEST(Gemma4ToolCalls, SeveralCallsWithTextAround) {
  auto r = parse("Let me check both.<|tool_call>call:a{x:1}<tool_call|><|tool_call>call:b{}<tool_call|>");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "Let me check both.");
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(r.calls[0].arguments_json, "{\"x\": 1}");
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].arguments_json, "{}");
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
}

TEST(Gemma4ToolCalls, QuotedKeysAndMarkupInsideStrings) {
  auto r = parse("<|tool_call>call:run{" + Q + "my key" + Q + ":1,code:" + Q + "if (a) { b(); } // <tool_call|>, x:y" + Q +
                 "}<tool_call|>");
  ASSERT_EQ(r.calls.size(), 1u) << r.content;
  EXPECT_EQ(r.calls[0].arguments_json, "{\"my key\": 1, \"code\": \"if (a) { b(); } // <tool_call|>, x:y\"}");
}

TEST(Gemma4ToolCalls, MissingClosingTagEndsAtTheNextCallOrTheEnd) {
  auto r = parse("<|tool_call>call:a{x:1}<|tool_call>call:b{y:" + Q + "z" + Q + "}");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments_json, "{\"x\": 1}");
  EXPECT_EQ(r.calls[1].arguments_json, "{\"y\": \"z\"}");
  EXPECT_EQ(r.content, "");
}

TEST(Gemma4ToolCalls, MalformedCallsStayContent) {
  for (const std::string& bad : {"<|tool_call>call:a{x:" + Q + "unterminated}<tool_call|> tail",
                                 std::string("<|tool_call>call:{x:1}<tool_call|>"), std::string("<|tool_call>a{x:1}<tool_call|>"),
                                 std::string("<|tool_call>call:a{x:1<tool_call|>"), std::string("<|tool_call>call:a{x:1} junk<tool_call|>"),
                                 std::string("Hello <|tool_call>call:a{x")}) {
    auto r = parse(bad);
    EXPECT_TRUE(r.calls.empty()) << bad;
    EXPECT_EQ(r.content, bad);
  }
  // A malformed call does not hide a good one after it; it stays in the content.
  auto r = parse("<|tool_call>call:{x:1}<tool_call|><|tool_call>call:b{}<tool_call|>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "b");
  EXPECT_EQ(r.content, "<|tool_call>call:{x:1}<tool_call|>");
}

TEST(Gemma4ToolCalls, DeepNestingIsRefusedNotACrash) {
  std::string deep = "<|tool_call>call:f{x:" + std::string(100000, '[') + std::string(100000, ']') + "}<tool_call|>";
  auto r = parse(deep);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content.size(), deep.size());
  std::string ok = "<|tool_call>call:f{x:" + std::string(30, '[') + "1" + std::string(30, ']') + "}<tool_call|>";
  EXPECT_EQ(parse(ok).calls.size(), 1u);
}

TEST(Gemma4ToolCalls, DetectionHoldbackAndStartMarker) {
  using hearth::chat::detect_tool_call_format;
  using hearth::chat::tool_call_holdback_start;
  EXPECT_EQ(detect_tool_call_format("{{- '<|tool_call>call:' + function['name'] + '{' -}}...'<tool_call|>'"),
            ToolCallFormat::Gemma4);
  EXPECT_EQ(tool_call_holdback_start("Hi <|tool", ToolCallFormat::Gemma4), 3u);
  EXPECT_EQ(tool_call_holdback_start("Hi <|tool_call>call:", ToolCallFormat::Gemma4), 3u);
  EXPECT_EQ(tool_call_holdback_start("Hi <tool_call>", ToolCallFormat::Gemma4), 14u);
  EXPECT_EQ(tool_call_holdback_start("Hi", ToolCallFormat::Gemma4), 2u);
  EXPECT_EQ(hearth::chat::tool_call_start_marker(ToolCallFormat::Gemma4), "<|tool_call>");
  EXPECT_EQ(hearth::chat::tool_call_start_marker(ToolCallFormat::Xml), "<tool_call>");
}

TEST(Gemma4ToolCalls, StreamedEqualsNonStreamedOnRecordedOutputs) {
  const std::vector<std::string> outputs = {
      "I'll look that up.<|tool_call>call:search{query:" + Q + "weather in Paris" + Q + ",limit:5}<tool_call|>",
      "<|tool_call>call:a{x:[1,2,{y:" + Q + "}" + Q + "}]}<tool_call|><|tool_call>call:b{}<tool_call|>",
      "<|tool_call>call:a{x:1}<|tool_call>call:b{y:true}",
      "No tools needed: a < b and <|tool is not a call.",
      "Broken <|tool_call>call:a{x:" + Q + "open<tool_call|> after",
  };
  std::mt19937 rng(3);
  for (const auto& text : outputs) {
    ParsedToolCalls whole = parse(text);
    for (int trial = 0; trial < 30; ++trial) {
      std::vector<size_t> cuts;
      for (size_t p = 0; p < text.size();) {
        p += 1 + rng() % 6;
        if (p < text.size()) cuts.push_back(p);
      }
      ParsedToolCalls s = streamed(text, cuts);
      ASSERT_EQ(s.calls.size(), whole.calls.size()) << text;
      for (size_t i = 0; i < s.calls.size(); ++i) {
        EXPECT_EQ(s.calls[i].name, whole.calls[i].name);
        EXPECT_EQ(s.calls[i].arguments_json, whole.calls[i].arguments_json);
      }
      EXPECT_EQ(s.content, whole.content) << text;
    }
  }
}
