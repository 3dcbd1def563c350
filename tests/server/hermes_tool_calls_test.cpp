// Hermes tool-call parsing: well-formed blocks, string arguments, malformed and unclosed blocks.
#include <gtest/gtest.h>

#include "server/hermes_tool_calls.h"

namespace hearth::server {
namespace {

TEST(HermesToolCalls, ParsesBlocksAndKeepsSurroundingText) {
  auto r = parse_hermes_tool_calls(
      "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"now\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(r.calls[0].arguments_json), (nlohmann::json{{"city", "Paris"}, {"days", 2}}));
  EXPECT_EQ(r.calls[1].name, "now");
  EXPECT_EQ(r.calls[1].arguments_json, "{}");
  EXPECT_EQ(r.calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(r.calls[0].id.size(), 29u);
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  EXPECT_EQ(r.content, "Checking.");
}

TEST(HermesToolCalls, StringArgumentsAreKeptVerbatim) {
  auto r = parse_hermes_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments_json, "{\"x\": 1}");
}

TEST(HermesToolCalls, MalformedBlockStaysContent) {
  auto r = parse_hermes_tool_calls("<tool_call>{not json}</tool_call>");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "<tool_call>{not json}</tool_call>");
  auto r2 = parse_hermes_tool_calls("<tool_call>{\"arguments\": {}}</tool_call>");  // no name
  EXPECT_TRUE(r2.calls.empty());
}

TEST(HermesToolCalls, UnclosedFinalBlockIsAccepted) {
  auto r = parse_hermes_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments_json, "{\"a\":[1,2]}");
  EXPECT_EQ(r.content, "");
}

TEST(HermesToolCalls, NoBlocksIsAllContent) {
  auto r = parse_hermes_tool_calls("  just text  ");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "just text");
}

}  // namespace
}  // namespace hearth::server
