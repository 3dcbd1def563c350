// ChatTemplate's transformers context beyond the golden renders: {% generation %} spans (the
// bookkeeping of return_assistant_tokens_mask), vLLM's content "" for tool-call turns without
// content, and too-deep inputs refused with the field named.
#include <gtest/gtest.h>

#include <string>

#include "chat/chat_template.h"
#include "core/json_nesting.h"

namespace {
using hearth::chat::ChatInputs;
using hearth::chat::ChatTemplate;
using hearth::chat::TemplateError;
using nlohmann::ordered_json;

std::string error_of(const ChatTemplate& t, const ChatInputs& in) {
  try {
    t.render(in);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST(ChatTemplate, GenerationBlocksReportTheirSpans) {
  ChatTemplate t(
      "{% for m in messages %}{{ m.role }}: {% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
      "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{{ '\\n' }}{% endfor %}");
  EXPECT_TRUE(t.has_generation_blocks());
  EXPECT_FALSE(ChatTemplate("{% for m in messages %}{% if m %}{{ m.content }}{% endif %}{% endfor %}").has_generation_blocks());
  ChatInputs in;
  in.messages = ordered_json::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
      {"role": "user", "content": "a"}, {"role": "assistant", "content": "bcd"}])");
  auto r = t.render_with_spans(in);
  EXPECT_EQ(r.text, "user: hi\nassistant: yo\nuser: a\nassistant: bcd\n");
  using Spans = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(r.generation_spans, (Spans{{20, 22}, {42, 45}}));
  EXPECT_EQ(t.render(in), r.text);
  // Inside a macro, the span is placed where the macro's output lands in the top-level text.
  ChatTemplate m("{% macro g(x) %}[{% generation %}{{ x }}{% endgeneration %}]{% endmacro %}ab{{ g('cd') }}");
  in.messages = ordered_json::parse(R"([{"role": "user", "content": "x"}])");
  auto rm = m.render_with_spans(in);
  EXPECT_EQ(rm.text, "ab[cd]");
  EXPECT_EQ(rm.generation_spans, (Spans{{2, 4}}));
}

TEST(ChatTemplate, NullContentBesideToolCallsBecomesEmptyWhenAsked) {
  // Real templates iterate over or concatenate content; None there is a template error.
  ChatTemplate t("{% for m in messages %}{% for c in m.content %}{{ c }}{% endfor %}|{% endfor %}");
  ChatInputs in;
  in.messages = ordered_json::parse(R"([{"role": "user", "content": "ab"},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]},
      {"role": "assistant", "tool_calls": []}])");
  EXPECT_NE(error_of(t, in).find("'NoneType' object is not iterable"), std::string::npos);
  in.null_content_as_empty = true;
  EXPECT_EQ(t.render(in), "ab|||");
  ChatTemplate is_none("{% for m in messages %}{{ m.content is none }},{{ m.content | length }};{% endfor %}");
  EXPECT_EQ(is_none.render(in), "False,2;False,0;False,0;");
}

TEST(ChatTemplate, TooDeepInputsNameTheField) {
  ChatTemplate t("{{ messages | length }}");
  const std::string deep = std::string(15000, '[') + std::string(15000, ']');
  ChatInputs in;
  in.messages = ordered_json::parse(R"([{"role": "user", "content": "x"}])");
  in.tools = ordered_json::parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": " + deep + "}}]");
  std::string e = error_of(t, in);
  EXPECT_EQ(e.rfind("chat template: tools: ", 0), 0u) << e;
  EXPECT_NE(e.find("nested deeper than 128 levels"), std::string::npos) << e;
  in.tools = nullptr;
  in.extra_kwargs = ordered_json::parse("{\"opts\": " + deep + "}");
  EXPECT_EQ(error_of(t, in).rfind("chat template: opts: ", 0), 0u);
  in.extra_kwargs = ordered_json::object();
  in.messages = ordered_json::parse("[{\"role\": \"user\", \"content\": " + deep + "}]");
  EXPECT_EQ(error_of(t, in).rfind("chat template: messages: ", 0), 0u);
}
