// The JSON nesting pre-scan (core/json_nesting.h): the limit is exact, strings do not count, and
// the reported path names the field where the text goes too deep.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/json_nesting.h"

namespace hearth {
namespace {

std::string nested(int levels, const std::string& open = "[", const std::string& close = "]") {
  std::string s;
  for (int i = 0; i < levels; ++i) s += open;
  for (int i = 0; i < levels; ++i) s += close;
  return s;
}

TEST(JsonNesting, LimitIsExactAndStringsDoNotCount) {
  EXPECT_FALSE(json_nesting_violation(nested(kMaxNesting)));
  EXPECT_TRUE(json_nesting_violation(nested(kMaxNesting + 1)));
  // Brackets inside strings (with escaped quotes) are text, not nesting.
  EXPECT_FALSE(json_nesting_violation("{\"a\": \"" + nested(5000) + "\\\"[[[\"}"));
  EXPECT_FALSE(json_nesting_violation(R"({"a": [1, {"b": 2}], "c": "x"})", 3));
  EXPECT_TRUE(json_nesting_violation(R"({"a": [1, {"b": 2}], "c": "x"})", 2));
}

TEST(JsonNesting, PathNamesTheField) {
  std::string deep = nested(15000);
  std::string body = R"({"model": "m", "messages": [], "tools": [{"type": "function"}, {"function": {"name": "f", "parameters": )" +
                     deep + "}}]}";
  auto path = json_nesting_violation(body);
  ASSERT_TRUE(path);
  EXPECT_EQ(*path, "tools[1].function.parameters[0][0][0][0]…");
  auto shallow = json_nesting_violation(R"({"a": {"b": [[[1]]]}})", 3);
  ASSERT_TRUE(shallow);
  EXPECT_EQ(*shallow, "a.b[0]");
  try {
    check_json_nesting(body, "req.json");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "req.json: tools[1].function.parameters[0][0][0][0]…: JSON nested deeper than 128 levels");
  }
}

}  // namespace
}  // namespace hearth
