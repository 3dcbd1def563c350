// Tests of Qwen XML tool-call parameter typing (chat::xml_param_value) against the behaviour of
// Qwen's reference parser (qwen3coder_tool_parser.py / vLLM qwen3_coder), directly and through
// parse_tool_calls with a tool schema.
#include <gtest/gtest.h>

#include "chat/tool_calls.h"

using hearth::chat::xml_param_value;
using nlohmann::ordered_json;

TEST(XmlParamValue, TypesFollowTheSchemaLikeQwensParser) {
  // Strings and unknown parameters keep the text; "null" is null for any type.
  EXPECT_EQ(xml_param_value("007", "string"), ordered_json("007"));
  EXPECT_EQ(xml_param_value("true", ""), ordered_json("true"));
  EXPECT_EQ(xml_param_value("x", "enum"), ordered_json("x"));
  EXPECT_EQ(xml_param_value("null", "string"), ordered_json(nullptr));
  EXPECT_EQ(xml_param_value("NULL", ""), ordered_json(nullptr));
  // Integers: Python int(); anything else stays text.
  EXPECT_EQ(xml_param_value("5", "integer"), ordered_json(5));
  EXPECT_EQ(xml_param_value(" -7 ", "int"), ordered_json(-7));
  EXPECT_EQ(xml_param_value("5.0", "integer"), ordered_json("5.0"));
  EXPECT_EQ(xml_param_value("99999999999999999999", "integer"), ordered_json("99999999999999999999"));
  // Numbers: float(), integral values as ints; inf/nan stay text.
  EXPECT_EQ(xml_param_value("3.0", "number"), ordered_json(3));
  EXPECT_TRUE(xml_param_value("3.0", "number").is_number_integer());
  EXPECT_EQ(xml_param_value("2.5", "Number"), ordered_json(2.5));
  EXPECT_EQ(xml_param_value("1e3", "float"), ordered_json(1000));
  EXPECT_EQ(xml_param_value("inf", "number"), ordered_json("inf"));
  EXPECT_EQ(xml_param_value("abc", "number"), ordered_json("abc"));
  // Booleans: true/false in any case; other text is kept (the reference would say false).
  EXPECT_EQ(xml_param_value("True", "boolean"), ordered_json(true));
  EXPECT_EQ(xml_param_value("FALSE", "bool"), ordered_json(false));
  EXPECT_EQ(xml_param_value("yes", "boolean"), ordered_json("yes"));
  // Objects and arrays: JSON, else a Python literal, else the text.
  EXPECT_EQ(xml_param_value("{\"a\": [1]}", "object"), ordered_json::parse("{\"a\": [1]}"));
  EXPECT_EQ(xml_param_value("{'a': True, 'b': None, 'c': 'it\\'s'}", "object"),
            ordered_json::parse("{\"a\": true, \"b\": null, \"c\": \"it's\"}"));
  EXPECT_EQ(xml_param_value("[1, 2]", "array"), ordered_json::parse("[1, 2]"));
  EXPECT_EQ(xml_param_value("not json", "object"), ordered_json("not json"));
  // Other types: a Python literal, else the text.
  EXPECT_EQ(xml_param_value("5", "any"), ordered_json(5));
  EXPECT_EQ(xml_param_value("hello", "any"), ordered_json("hello"));
}

TEST(XmlParamValue, ParseToolCallsTypesXmlValuesFromTheToolSchema) {
  ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"n": {"type": "number"}, "code": {"type": "string"},
      "k": {"type": "integer"}, "flag": {"type": "boolean"}, "items": {"type": "array"}}}}}])");
  std::string text =
      "<tool_call>\n<function=f>\n<parameter=n>\n3.0\n</parameter>\n<parameter=code>\n007\n</parameter>\n"
      "<parameter=k>\n12\n</parameter>\n<parameter=flag>\nFalse\n</parameter>\n<parameter=items>\n['a', 1]\n</parameter>\n"
      "<parameter=extra>\nnull\n</parameter>\n</function>\n</tool_call>";
  auto r = hearth::chat::parse_tool_calls(text, hearth::chat::ToolCallFormat::Xml, tools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments_json,
            "{\"n\": 3, \"code\": \"007\", \"k\": 12, \"flag\": false, \"items\": [\"a\", 1], \"extra\": null}");
}
