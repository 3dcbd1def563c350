// Values that nest too deep or contain themselves (value.cpp): Python's printing of recursive
// containers ([[...]]), bounded comparisons/JSON/conversions instead of a stack overflow, release
// of very deep values without recursion, and tojson(sort_keys=true) with json.dumps semantics.
// Expected strings follow CPython 3.12 / jinja2 3.1, derived by hand.
#include <gtest/gtest.h>

#include <string>

#include "chat/jinja_builtins.h"
#include "chat/jinja_interpreter.h"
#include "core/json_nesting.h"

namespace {
using hearth::chat::TemplateError;
using hearth::chat::Value;
using nlohmann::ordered_json;

std::string render_value(const std::string& tmpl, const std::string& ctx = "{}") {
  Value globals = Value::from_json(ordered_json::parse(ctx));
  hearth::chat::add_builtin_globals(globals);
  hearth::chat::Body body = hearth::chat::parse_template(tmpl);
  hearth::chat::Interpreter in;
  return in.render(body, globals);
}

std::string value_error_of(const std::string& tmpl, const std::string& ctx = "{}") {
  try {
    render_value(tmpl, ctx);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "<no error>";
}

std::string nested_text(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

const char* kSelf = "{% set a = [] %}{% set _ = a.append(a) %}{% set b = [] %}{% set _ = b.append(b) %}";
}  // namespace

TEST(ChatValue, SelfContainingContainersPrintLikePython) {
  EXPECT_EQ(render_value(std::string(kSelf) + "{{ a }}"), "[[...]]");
  EXPECT_EQ(render_value(std::string(kSelf) + "{{ a | join(',') }}|{{ [a, 1] }}"), "[[...]]|[[[...]], 1]");
  EXPECT_EQ(render_value("{% set a = [] %}{% set d = {'k': a} %}{% set _ = a.append(d) %}{{ d }}"), "{'k': [{...}]}");
  EXPECT_EQ(render_value("{% set ns = namespace() %}{% set ns.x = ns %}{{ ns }}"), "<Namespace {'x': <Namespace {...}>}>");
  EXPECT_EQ(render_value(std::string(kSelf) + "{{ a == a }} {{ a in [a] }} {{ [a, a] | sort | length }}"), "True True 2");
}

TEST(ChatValue, RecursiveOperationsFailCleanlyInsteadOfOverflowing) {
  const std::string deep = "nested deeper than 128 levels";
  EXPECT_NE(value_error_of(std::string(kSelf) + "{{ a == b }}").find(deep), std::string::npos);
  EXPECT_NE(value_error_of(std::string(kSelf) + "{{ a < b }}").find(deep), std::string::npos);
  EXPECT_NE(value_error_of(std::string(kSelf) + "{{ [a, b] | sort }}").find(deep), std::string::npos);
  EXPECT_NE(value_error_of(std::string(kSelf) + "{{ a | unique | list }}{{ [a, b] | unique | list }}").find(deep),
            std::string::npos);
  EXPECT_NE(value_error_of(std::string(kSelf) + "{{ a | tojson }}").find("Circular reference detected"), std::string::npos);
}

TEST(ChatValue, VeryDeepValuesAreBoundedAndReleasedWithoutRecursion) {
  // 1,000,000 levels built directly: destroying them used to recurse once per level.
  {
    Value v = Value::list();
    for (int i = 0; i < 1000000; ++i) v = Value::list({v});
  }
  // 20,000 levels built by a template (within its step budget) behave the same.
  const std::string build =
      "{% set ns = namespace(v=[]) %}{% for i in range(40) %}{% for j in range(500) %}{% set ns.v = [ns.v] %}"
      "{% endfor %}{% endfor %}";
  EXPECT_EQ(render_value(build + "{{ ns.v | length }} {{ ns.v == ns.v }}"), "1 True");
  EXPECT_NE(value_error_of(build + "{{ ns.v }}").find("nested deeper than 128 levels"), std::string::npos);
  const std::string two =
      "{% set ns = namespace(v=[], w=[]) %}{% for i in range(1000) %}{% set ns.v = [ns.v] %}{% set ns.w = [ns.w] %}"
      "{% endfor %}";
  EXPECT_NE(value_error_of(two + "{{ ns.v == ns.w }}").find("nested deeper than 128 levels"), std::string::npos);
  EXPECT_NE(value_error_of(two + "{{ ns.v < ns.w }}").find("nested deeper than 128 levels"), std::string::npos);
  EXPECT_NE(value_error_of(build + "{{ ns.v | tojson }}").find("nested deeper than 128 levels"), std::string::npos);
  // 128 levels print; 129 do not.
  EXPECT_EQ(render_value("{{ v }}", "{\"v\": " + nested_text(hearth::kMaxNesting - 1) + "}"), nested_text(hearth::kMaxNesting - 1));
  // JSON 15,000 levels deep (parsed iteratively) is refused by the conversion, not a crash.
  ordered_json deep = ordered_json::parse(nested_text(15000));
  EXPECT_THROW(Value::from_json(deep), TemplateError);
  EXPECT_NO_THROW(Value::from_json(ordered_json::parse(nested_text(hearth::kMaxNesting))));
  EXPECT_THROW(Value::from_json(ordered_json::parse(nested_text(hearth::kMaxNesting + 1))), TemplateError);
}

TEST(ChatValue, TojsonSortKeysFollowsJsonDumps) {
  EXPECT_EQ(render_value("{{ {'b': 1, 'a': {'d': [1, {'z': 0, 'y': 1}], 'c': 2}} | tojson(sort_keys=true) }}"),
            "{\"a\": {\"c\": 2, \"d\": [1, {\"y\": 1, \"z\": 0}]}, \"b\": 1}");
  EXPECT_EQ(render_value("{{ {'b': 1, 'a': 2} | tojson(indent=2, sort_keys=true) }}"), "{\n  \"a\": 2,\n  \"b\": 1\n}");
  EXPECT_EQ(render_value("{{ {'b': 1, 'a': 2} | tojson(false, none, none, true) }}"), "{\"a\": 2, \"b\": 1}");
  EXPECT_EQ(render_value("{{ {'b': 1, 'a': 2} | tojson }}"), "{\"b\": 1, \"a\": 2}");  // default: insertion order
  EXPECT_EQ(render_value("{{ {2: 'x', 1.5: 'y', true: 'z'} | tojson(sort_keys=true) }}"), "{\"true\": \"z\", \"1.5\": \"y\", \"2\": \"x\"}");
  EXPECT_EQ(render_value("{{ {'é': 1, 'z': 2, 'Z': 3} | tojson(sort_keys=true) }}"), "{\"Z\": 3, \"z\": 2, \"é\": 1}");
  EXPECT_NE(value_error_of("{{ {1: 'a', 'b': 2} | tojson(sort_keys=true) }}").find("'<' not supported"), std::string::npos);
}
