// JSON Schema → grammar: exact strings accepted and refused by the automaton (objects in property
// order, optional and extra keys, arrays with bounds, strings with escapes and UTF-8, numbers,
// formats, $ref recursion, anyOf, bounded whitespace), tool-call grammars, and 400-worthy errors.
#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar/json_schema.h"

namespace hearth::grammar {
namespace {

using J = nlohmann::ordered_json;

bool accepts(const std::shared_ptr<Grammar>& g, const std::string& text) {
  Automaton a(g);
  return a.accepting(a.walk(a.start(), text));
}

std::shared_ptr<Grammar> schema(const char* text) { return compile_json_schema(J::parse(text)); }

TEST(JsonSchemaGrammar, ObjectPropertiesInOrderRequiredEnumAndNoExtras) {
  auto g = schema(R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                      "tag": {"enum": ["a", "b"]}}, "required": ["name", "age"], "additionalProperties": false})");
  EXPECT_TRUE(accepts(g, R"({"name": "x", "age": 3})"));
  EXPECT_TRUE(accepts(g, R"({"name":"x","age":-12,"tag":"b"})"));
  EXPECT_TRUE(accepts(g, "{\n  \"name\": \"\",\n  \"age\": 0\n}"));
  EXPECT_FALSE(accepts(g, R"({"age": 3, "name": "x"})"));           // schema order
  EXPECT_FALSE(accepts(g, R"({"name": "x"})"));                     // required age missing
  EXPECT_FALSE(accepts(g, R"({"name": "x", "age": 3, "tag": "c"})"));  // not in the enum
  EXPECT_FALSE(accepts(g, R"({"name": "x", "age": 3, "other": 1})"));  // additionalProperties false
  EXPECT_FALSE(accepts(g, R"({"name": "x", "age": 3.5})"));         // not an integer
  EXPECT_FALSE(accepts(g, R"({"name": "x", "age": 3,})"));          // trailing comma
  EXPECT_FALSE(accepts(g, R"({"name": "x", "age": 3} )"));          // nothing after the value
}

TEST(JsonSchemaGrammar, ExtraKeysDifferFromDeclaredOnes) {
  auto g = schema(R"({"type": "object", "properties": {"name": {"type": "string"}}})");
  EXPECT_TRUE(accepts(g, R"({})"));
  EXPECT_TRUE(accepts(g, R"({"name": "a", "zzz": [1, {"q": null}]})"));
  EXPECT_TRUE(accepts(g, R"({"nam": 1, "names": 2, "": 3, "é": 4})"));
  EXPECT_FALSE(accepts(g, R"({"name": "a", "name": "b"})"));  // the declared key again as an extra
  EXPECT_FALSE(accepts(g, R"({"name": 1})"));                 // declared key with a wrong type
}

TEST(JsonSchemaGrammar, ArrayBounds) {
  auto g = schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2})");
  EXPECT_FALSE(accepts(g, "[]"));
  EXPECT_TRUE(accepts(g, "[1]"));
  EXPECT_TRUE(accepts(g, "[1, 22]"));
  EXPECT_FALSE(accepts(g, "[1, 2, 3]"));
  EXPECT_FALSE(accepts(g, "[\"1\"]"));
  auto free = schema(R"({"type": "array", "minItems": 2})");
  EXPECT_FALSE(accepts(free, "[1]"));
  EXPECT_TRUE(accepts(free, R"([1, "a", {}, []])"));
}

TEST(JsonSchemaGrammar, StringsEscapesUtf8AndLengths) {
  auto g = schema(R"({"type": "string"})");
  EXPECT_TRUE(accepts(g, R"("a\"b\\\u00e9\n")"));
  EXPECT_TRUE(accepts(g, "\"caf\xC3\xA9 \xF0\x9F\x98\x80\""));
  EXPECT_FALSE(accepts(g, "\"a\x01\""));        // raw control character
  EXPECT_FALSE(accepts(g, "\"\xC3(\""));        // broken UTF-8
  EXPECT_FALSE(accepts(g, "\"\xED\xA0\x80\""));  // a surrogate
  EXPECT_FALSE(accepts(g, R"("\x")"));           // unknown escape
  auto len = schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(accepts(len, R"("a")"));
  EXPECT_TRUE(accepts(len, "\"a\xC3\xA9\""));
  EXPECT_FALSE(accepts(len, R"("abcd")"));
}

TEST(JsonSchemaGrammar, NumbersAndBoundedWhitespace) {
  auto n = schema(R"({"type": "number"})");
  for (const char* ok : {"0", "-0.5e+10", "12.25", "1E3"}) EXPECT_TRUE(accepts(n, ok)) << ok;
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "--1"}) EXPECT_FALSE(accepts(n, bad)) << bad;
  EXPECT_FALSE(accepts(n, std::string(17, '9')));  // 16 digits at most
  auto o = schema(R"({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]})");
  // Between two tokens: nothing, one space, or one or two newlines and at most 20 blanks of indent
  // (llama.cpp's space rule); no runs of spaces a small model could loop on.
  EXPECT_TRUE(accepts(o, "{\"a\":true}"));
  EXPECT_TRUE(accepts(o, "{\"a\": true}"));
  EXPECT_TRUE(accepts(o, "{\n  \"a\": true\n}"));
  EXPECT_TRUE(accepts(o, "{\n\n\t\t\"a\" :\ntrue }"));
  EXPECT_TRUE(accepts(o, "{\"a\":\n" + std::string(20, ' ') + "true}"));
  EXPECT_FALSE(accepts(o, "{\"a\":\n" + std::string(21, ' ') + "true}"));
  EXPECT_FALSE(accepts(o, "{\"a\":  true}"));        // two spaces
  EXPECT_FALSE(accepts(o, "{\"a\": \ntrue}"));       // a space, then a newline
  EXPECT_FALSE(accepts(o, "{\"a\":\n\n\ntrue}"));    // three newlines
  EXPECT_FALSE(accepts(o, "{\"a\":\r\ntrue}"));      // no carriage returns
  JsonGrammarOptions tight;
  tight.max_indent = 2;
  auto t = compile_json_schema(J::parse(R"({"type": "array", "items": {"type": "integer"}})"), tight);
  EXPECT_TRUE(accepts(t, "[\n  1,\n  2\n]"));
  EXPECT_FALSE(accepts(t, "[\n   1]"));
}

TEST(JsonSchemaGrammar, ASchemaWithNoFiniteValueIsRefusedNamingItsPath) {
  auto message = [](const std::string& s) {
    try {
      compile_json_schema(J::parse(s));
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // An object that requires itself: no finite JSON text.
  const std::string loop = message(R"({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}},
      "required": ["next"], "additionalProperties": false}}, "type": "object", "properties": {"head": {"$ref": "#/$defs/node"}},
      "required": ["head"]})");
  EXPECT_NE(loop.find("no finite JSON value"), std::string::npos) << loop;
  EXPECT_NE(loop.find("#/$defs/node"), std::string::npos) << loop;
  // The root requiring itself through a non-empty array.
  const std::string root = message(R"({"type": "array", "items": {"$ref": "#"}, "minItems": 1})");
  EXPECT_NE(root.find("no finite JSON value"), std::string::npos) << root;
  EXPECT_NE(message(R"({"anyOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"},
      "minItems": 2}}})").find("at #/$defs/a"), std::string::npos);
  // Contradictions found while compiling.
  EXPECT_EQ(message(R"({"type": "object", "properties": {"xs": {"type": "array", "minItems": 5, "maxItems": 2}}})"),
            "invalid JSON Schema: 'maxItems' is below 'minItems' at #/properties/xs");
  EXPECT_EQ(message(R"({"enum": []})"), "invalid JSON Schema: 'enum' must be a non-empty array at #");
  EXPECT_EQ(message(R"({"type": "string", "minLength": 3, "maxLength": 1})"),
            "invalid JSON Schema: 'maxLength' is below 'minLength' at #");
  EXPECT_EQ(message(R"({"anyOf": []})"), "invalid JSON Schema: 'anyOf' must be a non-empty array at #");
  EXPECT_EQ(message(R"({"not": {}})"), "unsupported JSON Schema keyword 'not' at #");
  EXPECT_EQ(message("false"), "unsupported JSON Schema schema 'false' at #");
  // A tool whose parameters cannot end names the tool.
  try {
    tool_call_grammar({{"f", J::parse(R"({"$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
                                             "required": ["n"]}}, "$ref": "#/$defs/n"})")}},
                      "<tool_call>", "</tool_call>", "arguments");
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tools[0].function.parameters#/$defs/n"), std::string::npos) << e.what();
  }
}

// The keywords beside enum/const narrow their values (they were dropped: {"type": "string",
// "const": 5} produced 5); none left is a 400, and one that cannot narrow a list is unsupported.
TEST(JsonSchemaGrammar, EnumAndConstKeepOnlyTheValuesTheirSiblingsAllow) {
  auto typed = schema(R"({"type": "string", "enum": ["a", 1, null, "b"]})");
  EXPECT_TRUE(accepts(typed, R"("a")"));
  EXPECT_TRUE(accepts(typed, R"("b")"));
  EXPECT_FALSE(accepts(typed, "1"));
  EXPECT_FALSE(accepts(typed, "null"));
  auto integers = schema(R"({"type": ["integer", "null"], "enum": [1.0, 1.5, "x", null]})");
  EXPECT_TRUE(accepts(integers, "1.0"));
  EXPECT_TRUE(accepts(integers, "null"));
  EXPECT_FALSE(accepts(integers, "1.5"));
  auto lengths = schema(R"({"enum": ["a", "bbbbbbbb", "éé", ["x", "y"], 7], "maxLength": 2, "maxItems": 1})");
  EXPECT_TRUE(accepts(lengths, R"("a")"));
  EXPECT_TRUE(accepts(lengths, R"("éé")"));  // two code points, four bytes
  EXPECT_TRUE(accepts(lengths, "7"));         // length keywords bind strings (and items arrays) only
  EXPECT_FALSE(accepts(lengths, R"("bbbbbbbb")"));
  EXPECT_FALSE(accepts(lengths, R"(["x","y"])"));
  // Pydantic's Literal["a"]: const, enum and type together.
  auto literal = schema(R"({"const": "a", "enum": ["a", "b"], "type": "string"})");
  EXPECT_TRUE(accepts(literal, R"("a")"));
  EXPECT_FALSE(accepts(literal, R"("b")"));
  auto message = [](const char* text) {
    try {
      schema(text);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(R"({"type": "string", "const": 5})"),
            "invalid JSON Schema: no value of 'const' satisfies the keywords beside it at #");
  EXPECT_EQ(message(R"({"properties": {"k": {"enum": ["long"], "minLength": 5}}})"),
            "invalid JSON Schema: no value of 'enum' satisfies the keywords beside it at #/properties/k");
  EXPECT_EQ(message(R"({"const": "a", "enum": ["b"]})"),
            "invalid JSON Schema: no value of 'enum' satisfies the keywords beside it at #");
  EXPECT_EQ(message(R"({"enum": [{"a": 1}], "required": ["b"]})"),
            "unsupported JSON Schema keyword 'required' beside 'enum' at #");
  EXPECT_EQ(message(R"({"enum": ["a"], "type": "text"})"), "invalid JSON Schema: unknown type 'text' at #");
}

TEST(JsonSchemaGrammar, AnEndlessOptionalBranchIsPrunedNotEntered) {
  // "next" can never be completed, but it is optional: the schema has values, and the automaton
  // must not let a text start down the endless branch (it would end truncated).
  auto g = schema(R"({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}},
      "required": ["next"], "additionalProperties": false}}, "type": "object", "properties": {"v": {"type": "integer"},
      "next": {"$ref": "#/$defs/node"}}, "required": ["v"], "additionalProperties": false})");
  EXPECT_TRUE(accepts(g, R"({"v": 1})"));
  Automaton a(g);
  EXPECT_EQ(a.walk(a.start(), R"({"v": 1, "n)"), Automaton::kDead);
  // A recursive schema with a way out is untouched.
  auto tree = schema(R"({"$ref": "#/$defs/t", "$defs": {"t": {"type": "object", "properties": {"kids": {"type": "array",
      "items": {"$ref": "#/$defs/t"}}}, "required": ["kids"], "additionalProperties": false}}})");
  EXPECT_TRUE(accepts(tree, R"({"kids": [{"kids": []}, {"kids": [{"kids": []}]}]})"));
}

TEST(JsonSchemaGrammar, FormatsRefsAndAnyOf) {
  auto date = schema(R"({"type": "string", "format": "date"})");
  EXPECT_TRUE(accepts(date, R"("2024-02-29")"));
  EXPECT_FALSE(accepts(date, R"("2024-13-01")"));
  EXPECT_FALSE(accepts(date, R"("2024-1-01")"));
  auto uuid = schema(R"({"format": "uuid"})");
  EXPECT_TRUE(accepts(uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(accepts(uuid, R"("123e4567-e89b-12d3-a456-42661417400")"));
  auto dt = schema(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(accepts(dt, R"("2024-05-01T13:45:00.123Z")"));
  EXPECT_TRUE(accepts(dt, R"("2024-05-01T23:59:59+02:00")"));
  EXPECT_FALSE(accepts(dt, R"("2024-05-01T24:00:00Z")"));
  auto email = schema(R"({"type": "string", "format": "email"})");
  EXPECT_TRUE(accepts(email, R"("a.b+c@example.co.uk")"));
  EXPECT_FALSE(accepts(email, R"("a@localhost")"));
  auto tree = schema(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v", "kids"], "additionalProperties": false}}})");
  EXPECT_TRUE(accepts(tree, R"({"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})"));
  EXPECT_FALSE(accepts(tree, R"({"v": 1, "kids": [{"v": 2}]})"));
  auto any = schema(R"({"anyOf": [{"type": "string"}, {"type": "null"}], "description": "x"})");
  EXPECT_TRUE(accepts(any, "null"));
  EXPECT_TRUE(accepts(any, R"("s")"));
  EXPECT_FALSE(accepts(any, "1"));
  auto types = schema(R"({"type": ["integer", "boolean"]})");
  EXPECT_TRUE(accepts(types, "false"));
  EXPECT_FALSE(accepts(types, "null"));
  auto c = schema(R"({"const": {"k": [1, "two"]}})");
  EXPECT_TRUE(accepts(c, R"({"k":[1,"two"]})"));
}

TEST(JsonSchemaGrammar, JsonObjectAndFinalState) {
  auto g = json_object_grammar();
  EXPECT_TRUE(accepts(g, R"({"a": {"b": [1, true, null, "x", -2.5e3]}})"));
  EXPECT_TRUE(accepts(g, "{}"));
  EXPECT_FALSE(accepts(g, "[1]"));
  EXPECT_FALSE(accepts(g, "\"x\""));
  Automaton a(g);
  const int32_t s = a.walk(a.start(), R"({"a": 1})");
  EXPECT_TRUE(a.final(s));
  const int32_t open = a.walk(a.start(), R"({"a": 1)");
  EXPECT_FALSE(a.accepting(open));
  // An integer at the top level accepts but may still grow: not final.
  auto n = schema(R"({"type": "integer"})");
  Automaton b(n);
  EXPECT_TRUE(b.accepting(b.walk(b.start(), "12")));
  EXPECT_FALSE(b.final(b.walk(b.start(), "12")));
}

TEST(JsonSchemaGrammar, ToolCallGrammar) {
  auto g = tool_call_grammar({{"get_weather", J::parse(R"({"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"], "additionalProperties": false})")},
                              {"now", J()}},
                             "<tool_call>", "</tool_call>", "arguments");
  EXPECT_TRUE(accepts(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
  EXPECT_TRUE(accepts(g, "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>"));
  EXPECT_FALSE(accepts(g, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>"));
  EXPECT_FALSE(accepts(g, "<tool_call>{\"name\": \"other\", \"arguments\": {}}</tool_call>"));
  EXPECT_FALSE(accepts(g, "{\"name\": \"now\", \"arguments\": {}}"));
}

TEST(JsonSchemaGrammar, UnsupportedFeaturesAreNamed) {
  auto message = [](const char* s) {
    try {
      compile_json_schema(J::parse(s));
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(R"({"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}})"),
            "unsupported JSON Schema keyword 'pattern' at #/properties/zip");
  EXPECT_EQ(message(R"({"type": "integer", "minimum": 0})"), "unsupported JSON Schema keyword 'minimum' at #");
  EXPECT_EQ(message(R"({"type": "string", "format": "hostname"})"),
            "unsupported JSON Schema format 'hostname' (supported: date, time, date-time, uuid, email, ipv4) at #");
  EXPECT_EQ(message(R"({"allOf": [{"type": "string"}, {"maxLength": 2}]})"),
            "unsupported JSON Schema 'allOf' with more than one schema at #");
  EXPECT_EQ(message(R"({"$ref": "https://example.com/s.json"})"),
            "unsupported JSON Schema $ref 'https://example.com/s.json' (only local references like #/$defs/name) at #");
  EXPECT_EQ(message(R"({"$ref": "#/$defs/missing"})"), "invalid JSON Schema: $ref '#/$defs/missing' points nowhere at #");
  EXPECT_EQ(message(R"({"type": "yaml"})"), "invalid JSON Schema: unknown type 'yaml' at #");
  EXPECT_EQ(message(R"({"type": "array", "maxItems": 100000})"), "unsupported JSON Schema 'maxItems' above 4096 at #");
}

}  // namespace
}  // namespace hearth::grammar

namespace hearth::grammar {
namespace {

// Found by the attack run: 1,500 properties with maxLength 4096 (a 79 KB body) compiled to
// millions of grammar states and ~1 GB of server memory. The compile now stops at a bound.
TEST(JsonSchemaGrammar, AHugeUnrolledSchemaIsRefusedBeforeItEatsMemory) {
  nlohmann::ordered_json s = {{"type", "object"}, {"properties", nlohmann::ordered_json::object()}};
  for (int i = 0; i < 1500; ++i) s["properties"]["p" + std::to_string(i)] = {{"type", "string"}, {"maxLength", 4096}};
  try {
    compile_json_schema(s);
    ADD_FAILURE() << "a schema of ~6M grammar states was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("too large"), std::string::npos) << e.what();
  }
  // A modest schema of the same kind still compiles.
  nlohmann::ordered_json ok = {{"type", "object"}, {"properties", nlohmann::ordered_json::object()}};
  for (int i = 0; i < 20; ++i) ok["properties"]["p" + std::to_string(i)] = {{"type", "string"}, {"maxLength", 4096}};
  EXPECT_NO_THROW(compile_json_schema(ok));
}

}  // namespace
}  // namespace hearth::grammar
