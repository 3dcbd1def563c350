// Unit tests of the chat-template Jinja interpreter. Expected strings follow Python jinja2 3.1 with
// transformers' settings (trim_blocks, lstrip_blocks, loopcontrols) and Python's str/repr/json
// rules; each was derived by hand from those semantics, not by running this code.
#include <gtest/gtest.h>

#include <string>

#include "chat/chat_template.h"
#include "chat/jinja_builtins.h"
#include "chat/jinja_interpreter.h"

namespace {
using hearth::chat::TemplateError;
using hearth::chat::Value;
using nlohmann::ordered_json;

std::string R(const std::string& tmpl, const std::string& ctx = "{}", hearth::chat::RenderLimits lim = {}) {
  Value globals = Value::from_json(ordered_json::parse(ctx));
  hearth::chat::add_builtin_globals(globals);
  hearth::chat::Body body = hearth::chat::parse_template(tmpl);
  hearth::chat::Interpreter in(lim);
  return in.render(body, globals);
}

std::string jinja_error_of(const std::string& tmpl, const std::string& ctx = "{}", hearth::chat::RenderLimits lim = {}) {
  try {
    R(tmpl, ctx, lim);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST(Jinja, WhitespaceControl) {
  EXPECT_EQ(R("a  {%- if true %} b {% endif -%}  c"), "a b c");
  EXPECT_EQ(R("a \n{{- 'b' -}}\n c"), "abc");
  EXPECT_EQ(R("a {#- c -#} b"), "ab");
  EXPECT_EQ(R("{{ 'x' }}  {{ 'y' }}"), "x  y");
}

TEST(Jinja, TrimAndLstripBlocks) {
  EXPECT_EQ(R("{% if true %}\nhello\n{% endif %}\nworld"), "hello\nworld");
  EXPECT_EQ(R("  {% if true %}\n  x\n  {% endif %}\n"), "  x\n");
  EXPECT_EQ(R("x\n  {{ 'y' }}"), "x\n  y");                // lstrip_blocks ignores {{
  EXPECT_EQ(R("a\n  {# c #}\nb"), "a\nb");                  // comments are lstripped and trimmed
  EXPECT_EQ(R("  {%+ if true %}x{% endif %}"), "  x");      // + disables lstrip
  EXPECT_EQ(R("{{ 'a' }}  {% if true %}b{% endif %}"), "a  b");  // not at line start: kept
  EXPECT_EQ(R("hi\n"), "hi");                               // one trailing newline dropped
  EXPECT_EQ(R("hi\n\n"), "hi\n");
  EXPECT_EQ(R("a\r\nb"), "a\nb");
  EXPECT_EQ(R("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(Jinja, PythonPrinting) {
  EXPECT_EQ(R("{{ 1.0 }}|{{ True }}|{{ none }}|{{ [1,'a'] }}|{{ {'a': 1} }}"), "1.0|True|None|[1, 'a']|{'a': 1}");
  EXPECT_EQ(R("{{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}"),
            "3.5 2.0 3 -4 2 1024 0.5");
  EXPECT_EQ(R("{{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 1e16 }} {{ 123456789.0 * 10 }} {{ 1.5e3 }}"),
            "0.30000000000000004 1e-05 1e+16 1234567890.0 1500.0");
  EXPECT_EQ(R("{{ (1, 2) }} {{ (1,) }} {{ () }}"), "(1, 2) (1,) ()");
  EXPECT_EQ(R("{{ [\"it's\", 'q\"', 'a\\nb'] }}"), "[\"it's\", 'q\"', 'a\\nb']");
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ none ~ undefined_name }}"), "a1None");
  EXPECT_EQ(R("{{ 'a\\tb\\u00e9\\x41' }}"), "a\tbéA");
  EXPECT_EQ(R("{{ [none, true, 1.5, {'k': [2]}] }}"), "[None, True, 1.5, {'k': [2]}]");
}

TEST(Jinja, OperatorsAndPrecedence) {
  EXPECT_EQ(R("{{ 1 + 2 * 3 ** 2 }} {{ -2 ** 2 }} {{ 'a' ~ 2 * 3 }} {{ -3|abs }}"), "19 4 a6 3");
  EXPECT_EQ(R("{{ 'ab' * 2 }} {{ [1] * 2 }} {{ [1] + [2] }}"), "abab [1, 1] [1, 2]");
  EXPECT_EQ(R("{{ 'b' in 'abc' }} {{ 2 not in [1,2] }} {{ 'a' in {'a':1} }} {{ 1 < 2 < 3 }} {{ 1 == 1.0 }}"),
            "True False True True True");
  EXPECT_EQ(R("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ [] and 1 }} {{ not '' }}"), "x y [] True");
  EXPECT_EQ(R("{{ 'a' if 0 else 'b' }}|{{ 'a' if 0 }}|{{ 'a' if 1 }}"), "b||a");
  EXPECT_EQ(R("{{ xs|length - 1 }}", R"({"xs": [1, 2, 3]})"), "2");
  EXPECT_EQ(R("{{ 'ab' 'cd' }}"), "abcd");  // adjacent string literals concatenate
}

TEST(Jinja, UndefinedSemantics) {
  EXPECT_EQ(R("{{ x is defined }}{{ x is undefined }}{{ x }}"), "FalseTrue");
  EXPECT_EQ(R("{{ d.missing is defined }}|{{ d.missing }}|{{ d['missing'] }}|{{ xs[10] }}", R"({"d": {}, "xs": []})"),
            "False|||");
  EXPECT_EQ(R("{{ x or 'dflt' }} {{ x | default('z') }} {{ '' | default('z') }}|{{ '' | default('z', true) }} "
              "{{ none | d('z') }}"),
            "dflt z |z None");
  EXPECT_EQ(R("{% for a in nothing %}x{% endfor %}{{ nothing|length }}"), "0");
  EXPECT_NE(jinja_error_of("{{ x.y }}").find("'x' is undefined"), std::string::npos);
  EXPECT_NE(jinja_error_of("{{ x + 1 }}").find("'x' is undefined"), std::string::npos);
}

TEST(Jinja, ForLoops) {
  EXPECT_EQ(R("{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
              "{{ loop.length }}{{ loop.revindex }}|{% endfor %}"),
            "10TrueFalse33|21FalseFalse32|32FalseTrue31|");
  EXPECT_EQ(R("{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}"), "-2,1-3,2-,");
  EXPECT_EQ(R("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in range(6) if x is even %}{{ x }}{{ loop.length }} {% endfor %}"), "03 23 43 ");
  EXPECT_EQ(R("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
              "{{ x }}{% endfor %}"),
            "013");
  EXPECT_EQ(R("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(R("{% for k in {'z': 1, 'a': 2} %}{{ k }}{% endfor %}"), "za");  // dicts keep insertion order
  EXPECT_EQ(R("{% for c in 'hé' %}[{{ c }}]{% endfor %}"), "[h][é]");
  EXPECT_EQ(R("{% for a in [1,2] %}{% for b in [1] %}{% endfor %}{{ loop.index }}{% endfor %}"), "12");
  EXPECT_EQ(R("{% for x in [1,2,3] %}{{ loop.cycle('a','b') }}{% endfor %}"), "aba");
  EXPECT_EQ(R("{% for m in msgs[::-1] %}{{ m }}{% endfor %}", R"({"msgs": [1, 2, 3]})"), "321");
}

TEST(Jinja, Scoping) {
  // set inside a loop is per-iteration and does not leak; namespaces carry state out.
  EXPECT_EQ(R("{% set x = 0 %}{% for i in [1,2] %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}"), "110");
  EXPECT_EQ(R("{% set ns = namespace(c=0) %}{% for i in [1,2,3] %}{% set ns.c = ns.c + i %}{% endfor %}{{ ns.c }}"), "6");
  EXPECT_EQ(R("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
  EXPECT_EQ(R("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(R("{% set s %}abc{% endset %}{{ s | upper }}"), "ABC");
  EXPECT_EQ(R("{% filter upper %}hi {{ 'x' }}{% endfilter %}"), "HI X");
  EXPECT_EQ(R("{% with a = 2 %}{{ a }}{% endwith %}{{ a }}"), "2");
  EXPECT_EQ(R("{% generation %}gen{% endgeneration %}!"), "gen!");
  EXPECT_NE(jinja_error_of("{% set n = 1 %}{% set n.x = 2 %}").find("non-namespace"), std::string::npos);
}

TEST(Jinja, Macros) {
  EXPECT_EQ(R("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
              "{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet() }}"),
            "Hi Bob! Hi Al? Hi !");
  EXPECT_NE(jinja_error_of("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").find("recursion"), std::string::npos);
}

TEST(Jinja, Slicing) {
  EXPECT_EQ(R("{{ [1,2,3,4][::-1] }} {{ 'hello'[1:] }} {{ 'hello'[:-1] }} {{ [1,2,3][5:] }} {{ 'héllo'[1] }} "
              "{{ 'abcde'[::2] }} {{ 'abc'[-1] }} {{ [1,2,3][-2:] }}"),
            "[4, 3, 2, 1] ello hell [] é ace c [2, 3]");
}

TEST(Jinja, StringMethods) {
  EXPECT_EQ(R("{{ '  a b  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ 'x  '.rstrip() }}|"),
            "a b|hi|x\n|x|");
  EXPECT_EQ(R("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }}"),
            "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a b', 'c']");
  EXPECT_EQ(R("{{ 'x</think>y'.split('</think>')[-1] }} {{ 'hello world'.title() }} {{ \"they're\".title() }} "
              "{{ 'hELLO'.capitalize() }} {{ 'abc'.upper() }} {{ 'ÀB'.lower() }}"),
            "y Hello World They'Re Hello ABC àb");
  EXPECT_EQ(R("{{ 'abc'.startswith(('x','a')) }} {{ 'abc'.endswith('bc') }} {{ 'aaa'.replace('a','b',2) }} "
              "{{ 'héllo'.find('l') }} {{ 'a-b-c'.count('-') }} {{ '-'.join(['a','b']) }}"),
            "True True bba 2 2 a-b");
  EXPECT_EQ(R("{{ '{} and {name}'.format(1, name='x') }}"), "1 and x");
}

TEST(Jinja, DictAndListMethods) {
  const char* ctx = R"({"d": {"a": 1, "b": [2]}})";
  EXPECT_EQ(R("{{ d.get('a') }} {{ d.get('z', 5) }} {{ d.get('z') }} {{ d.keys()|list }} {{ d.values()|list }} "
              "{{ d.items()|list }}",
              ctx),
            "1 5 None ['a', 'b'] [1, [2]] [('a', 1), ('b', [2])]");
  EXPECT_EQ(R("{% set ns = namespace(xs=[]) %}{% for i in [1,2] %}{% set _ = ns.xs.append(i * 10) %}{% endfor %}"
              "{{ ns.xs }}"),
            "[10, 20]");
}

TEST(Jinja, Filters) {
  EXPECT_EQ(R("{{ ' x '|trim }}|{{ 'héllo'|length }}|{{ [1,2]|join(', ') }}|{{ [1,2]|first }}{{ [1,2]|last }}|"
              "{{ 'ab'|list }}|{{ 3|string ~ 'x' }}"),
            "x|5|1, 2|12|['a', 'b']|3x");
  EXPECT_EQ(R("{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '1.5'|float }} {{ 3|float }}"),
            "42 4 0 7 1.5 3.0");
  EXPECT_EQ(R("{{ 'hello-world foo'|title }} {{ 'hELLO'|capitalize }} {{ 'Ab'|upper }}{{ 'Ab'|lower }} "
              "{{ 'aXa'|replace('a', 'b') }}"),
            "Hello-World Foo Hello ABab bXb");
  const char* people = R"({"ps": [{"n": "b", "x": 1}, {"n": "a", "x": 0}, {"n": "C", "x": 1}]})";
  EXPECT_EQ(R("{{ ps|map(attribute='n')|list }} {{ ps|selectattr('x')|map(attribute='n')|join }} "
              "{{ ps|rejectattr('x')|map(attribute='n')|join }} {{ ps|selectattr('n', 'equalto', 'a')|list|length }} "
              "{{ ps|sort(attribute='n')|map(attribute='n')|join }}",
              people),
            "['b', 'a', 'C'] bC a 1 abC");
  EXPECT_EQ(R("{{ ['a','b']|map('upper')|list }} {{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3,4]|reject('odd')|list }} "
              "{{ [1,2,1,3]|unique|list }} {{ ['A','a','b']|unique|list }}"),
            "['A', 'B'] [1, 3] [2, 4] [1, 2, 3] ['A', 'b']");
  EXPECT_EQ(R("{{ [3,1,2]|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ ['b','A','c']|sort }} {{ [1,2]|reverse|list }} "
              "{{ 'abc'|reverse }}"),
            "[1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] [2, 1] cba");
  EXPECT_EQ(R("{{ -3|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 3.14159|round(2) }} {{ 2.7|round(method='floor') }} "
              "{{ 42|round }}"),
            "3 2.0 4.0 3.14 2.0 42.0");
  EXPECT_EQ(R("{{ 'a\\nb'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}"),
            "a\n  b|  a\n  b|a\n\n  b|a\n  \n  b");
  EXPECT_EQ(R("{{ '<a href=\"x\">&'|e }} {{ 'x'|safe }}"), "&lt;a href=&#34;x&#34;&gt;&amp; x");
  EXPECT_EQ(R("{{ [1,2,3]|batch(2)|list }} {{ {'a': 1}|items|list }} {{ [1,2,3]|sum }} {{ [3,1,2]|min }}{{ [3,1,2]|max }} "
              "{{ {'b': 1, 'a': 2}|dictsort }}"),
            "[[1, 2], [3]] [('a', 1)] 6 13 [('a', 2), ('b', 1)]");
  EXPECT_EQ(R("{{ 'a b  c'|wordcount }} {{ 'ab'|center(6) }}| {{ '%s-%d'|format('a', 3) }} {{ [1,2]|count }}"),
            "3   ab  | a-3 2");
}

TEST(Jinja, ToJson) {
  EXPECT_EQ(R("{{ {'b': 1, 'a': [1, 2.5, none, true, 'é\"\\n']} | tojson }}"),
            "{\"b\": 1, \"a\": [1, 2.5, null, true, \"é\\\"\\n\"]}");
  EXPECT_EQ(R("{{ {'a': [1, {}], 'b': []} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
  EXPECT_EQ(R("{{ 'é😀' | tojson(ensure_ascii=true) }}"), "\"\\u00e9\\ud83d\\ude00\"");
  EXPECT_EQ(R("{{ [1, {'a': 2}] | tojson(separators=(',', ':')) }}"), "[1,{\"a\":2}]");
  EXPECT_EQ(R("{{ 1.0 | tojson }} {{ 1e20 | tojson }} {{ '</s>' | tojson }} {{ '\\x01' | tojson }}"),
            "1.0 1e+20 \"</s>\" \"\\u0001\"");
  EXPECT_EQ(R("{{ t | tojson }}", R"({"t": {"z": {"y": 1, "x": 2}, "a": null}})"), "{\"z\": {\"y\": 1, \"x\": 2}, \"a\": null}");
  EXPECT_NE(jinja_error_of("{{ x | tojson }}").find("not JSON serializable"), std::string::npos);
}

TEST(Jinja, Tests) {
  EXPECT_EQ(R("{{ 3 is odd }}{{ 4 is divisibleby 2 }}{{ 4 is divisibleby(3) }}{{ 'a' is string }}{{ {} is mapping }}"
              "{{ [] is iterable }}"),
            "TrueTrueFalseTrueTrueTrue");
  EXPECT_EQ(R("{{ 1 is number }}{{ true is number }}{{ true is integer }}{{ 1.0 is float }}{{ none is none }}"
              "{{ x is not defined }}{{ false is false }}{{ 0 is false }}{{ 'a' is sequence }}{{ 'A' is upper }}"
              "{{ 1 is eq(1) }}{{ 2 is gt 1 }}{{ 1 is in [1] }}{{ true is boolean }}{{ 5 is not even }}"),
            "TrueTrueFalseTrueTrueTrueTrueFalseTrueTrueTrueTrueTrueTrueTrue");
}

TEST(Jinja, Errors) {
  EXPECT_EQ(jinja_error_of("{{ raise_exception('boom') }}"), "chat template: raise_exception: boom");
  EXPECT_EQ(jinja_error_of("x\n{{ 1 | nope }}"), "chat template: line 2: no filter named 'nope'");
  EXPECT_EQ(jinja_error_of("a\nb\n{% if %}"), "chat template: line 3: unexpected end of statement block");
  EXPECT_NE(jinja_error_of("{% if true %}x").find("'endif'"), std::string::npos);
  EXPECT_NE(jinja_error_of("{% for x in y %}").find("endfor"), std::string::npos);
  EXPECT_NE(jinja_error_of("{{ 'abc }}").find("unterminated string"), std::string::npos);
  EXPECT_NE(jinja_error_of("{% break %}").find("outside a loop"), std::string::npos);
  EXPECT_NE(jinja_error_of("{% foo %}").find("unknown tag 'foo'"), std::string::npos);
  EXPECT_NE(jinja_error_of("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(jinja_error_of("{{ 1 + 'a' }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(jinja_error_of("{{ 'x'.nope() }}").find("no attribute 'nope'"), std::string::npos);
  EXPECT_NE(jinja_error_of("{{ range(1000000) }}").find("MAX_RANGE"), std::string::npos);
}

TEST(Jinja, LimitsStopHostileTemplates) {
  hearth::chat::RenderLimits small;
  small.max_steps = 100000;
  EXPECT_NE(jinja_error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "{}", small)
                .find("step limit"),
            std::string::npos);
  small.max_output_bytes = 1000;
  EXPECT_NE(jinja_error_of("{{ 'a' * 100000 }}", "{}", small).find("size limit"), std::string::npos);
  EXPECT_NE(jinja_error_of("{{ " + std::string(5000, (char)40) + "1" + std::string(5000, (char)41) + " }}").find("nested too deeply"), std::string::npos);
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  EXPECT_NE(jinja_error_of(chain + " }}").find("nested too deeply"), std::string::npos);
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  EXPECT_NE(jinja_error_of(ifs).find("nested too deeply"), std::string::npos);
}

TEST(ChatTemplate, ContextMatchesTransformers) {
  ordered_json msgs = ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  const char* t = "{{ tools is none }}|{{ bos_token is defined }}|{{ eos_token }}|{{ add_generation_prompt }}|"
                  "{{ enable_thinking }}|{{ messages[0].content }}";
  EXPECT_EQ(hearth::chat::render_chat_template(t, msgs, nullptr, true, ordered_json::parse(R"({"enable_thinking": false})"),
                                               "", "</s>"),
            "True|False|</s>|True|False|hi");
  EXPECT_THROW(hearth::chat::render_chat_template(t, ordered_json::array(), nullptr, false, {}, "", ""), TemplateError);
  EXPECT_EQ(hearth::chat::render_chat_template("{{ strftime_now('%Y')|length }}", msgs, nullptr, false, {}, "", ""), "4");
}
