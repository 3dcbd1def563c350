// The chat-template render budget (RenderLimits): an endless template fails within seconds under
// the default step limit (loop iterations and range sizes weighted), the strings and lists a template builds or copies out of
// variables are bounded in total, serialising or comparing a shared nested value is bounded, and a large real conversation still
// renders under the defaults.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "chat/chat_template.h"
#include "chat/jinja_builtins.h"
#include "chat/jinja_interpreter.h"

namespace {
using hearth::chat::RenderLimits;
using hearth::chat::TemplateError;
using hearth::chat::Value;
using nlohmann::ordered_json;

std::string budget_error_of(const std::string& tmpl, RenderLimits lim = {}) {
  try {
    Value globals = Value::dict();
    hearth::chat::add_builtin_globals(globals);
    hearth::chat::Interpreter in(lim);
    in.render(hearth::chat::parse_template(tmpl), globals);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(JinjaBudget, AnEndlessTemplateFailsWithinSeconds) {
  // Loop iterations are the costliest steps (each builds a `loop` object): 20 M of them took
  // about 70 s; the default budget now stops this within a few seconds even on a loaded machine.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string err = budget_error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(err.find("step limit"), std::string::npos) << err;
  EXPECT_LT(s, 15.0);  // ~1 s on an idle core, a few on a loaded machine; 20 M steps took 70 s idle
}

TEST(JinjaBudget, StringsBuiltOrCopiedAreBoundedInTotal) {
  RenderLimits small;
  small.max_total_string_bytes = 1u << 20;
  // Each string is small; together they pass the total: copies out of a variable...
  EXPECT_NE(budget_error_of("{% set s = 'x' * 100000 %}{% set l = [] %}{% for i in range(100) %}{% set _ = l.append(s) %}"
                     "{% endfor %}{{ l|length }}", small)
                .find("total size limit"),
            std::string::npos);
  // ... and strings built by operators.
  EXPECT_NE(budget_error_of("{% set l = [] %}{% for i in range(100) %}{% set _ = l.append('y' * 20000) %}{% endfor %}", small)
                .find("total size limit"),
            std::string::npos);
  // range() pays for its size: a loop that builds big ranges runs out of steps.
  RenderLimits steps;
  steps.max_steps = 100000;
  EXPECT_NE(budget_error_of("{% for i in range(100) %}{% set r = range(100000) %}{% endfor %}", steps).find("step limit"),
            std::string::npos);
  // Under the total: fine.
  EXPECT_EQ(budget_error_of("{% set s = 'x' * 1000 %}{% set l = [] %}{% for i in range(100) %}{% set _ = l.append(s) %}"
                     "{% endfor %}{{ l|length }}", small),
            "<no error>");
}

// Lists doubled in a loop, and shared nested values serialised or compared, grew to gigabytes
// (or 2^40 steps) under the defaults before lists were weighed and serialisation and walks
// bounded: each now fails, naming the limit.
TEST(JinjaBudget, ListsAndSharedNestedValuesAreBounded) {
  const char* ns1 = "{% set ns = namespace(x=[1]) %}";
  struct Case {
    std::string tmpl, expect;
  };
  for (const Case& c : {
           Case{std::string(ns1) + "{% for i in range(40) %}{% set ns.x = ns.x * 2 %}{% endfor %}{{ ns.x|length }}",
                "size limit"},
           Case{"{% set ns = namespace(x=[]) %}{% for i in range(30) %}{% set ns.x = ns.x + ns.x + [1] %}{% endfor %}"
                "{{ ns.x|length }}",
                "size limit"},
           Case{"{% set ns = namespace(x=[1]) %}{% for i in range(30) %}{% set _ = ns.x.extend(ns.x) %}{% endfor %}",
                "size limit"},
           // A list copies its strings: 100,000 copies of 1 MB took 15 GB.
           Case{"{% set s = 'a' * 1000000 %}{% set l = [s] * 100000 %}{{ l|length }}", "size limit"},
           Case{"{% set s = 'a' * 1000000 %}{% set ns = namespace(l=[s]) %}{% for i in range(20) %}"
                "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
                "size limit"},
           Case{"{% set s = 'a' * 1000000 %}{% set l = [] %}{% for i in range(3000) %}{% set _ = l.append(s) %}"
                "{% endfor %}{{ l|length }}",
                "total size limit"},
           Case{"{% set ns = namespace(d={}) %}{% for i in range(30) %}{% set ns.d = {'a': ns.d, 'b': ns.d} %}{% endfor %}"
                "{{ ns.d|tojson|length }}",
                "tojson: "},
           Case{std::string(ns1) + "{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|tojson|length }}",
                "tojson: "},
           Case{std::string(ns1) + "{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|string|length }}",
                "repr: "},
           Case{"{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}"
                "{% set ns.y = [ns.y, ns.y] %}{% endfor %}{{ ns.x == ns.y }}",
                "too large to walk"},
       }) {
    const std::string err = budget_error_of(c.tmpl);  // 0.1-2 s each on an idle core
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.tmpl << "\n" << err;
  }
  // Ordinary list work stays far below the limits.
  EXPECT_EQ(budget_error_of("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = ns.x + [i] %}"
                            "{% endfor %}{{ ns.x|tojson|length }}"),
            "<no error>");
}

TEST(JinjaBudget, ALargeConversationRendersUnderTheDefaults) {
  // 2,000 messages, 8 MiB of text, through a ChatML template that looks at each content twice.
  const char* tmpl =
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string and '<think>' in m.content %}"
      "{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  ordered_json msgs = ordered_json::array();
  for (int i = 0; i < 2000; ++i)
    msgs.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", std::string(4096, static_cast<char>('a' + i % 26))}});
  const std::string out = hearth::chat::render_chat_template(tmpl, msgs, nullptr, true, ordered_json::object(), "", "");
  EXPECT_GT(out.size(), 2000u * 4096u);
  EXPECT_EQ(out.substr(out.size() - 22), "<|im_start|>assistant\n");
}

}  // namespace
