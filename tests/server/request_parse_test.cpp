// Request parsing: OpenAI bodies -> native structs, and the 400s for bad fields.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/request_parse.h"

namespace hearth::server {
namespace {

using OJ = nlohmann::ordered_json;

CompletionRequest parse_chat(const std::string& body) { return parse_chat_request(parse_body(body)); }

// Returns the ApiError's param for a body that must be rejected with 400.
std::string rejected_param(const std::string& body, bool is_chat = true) {
  try {
    OJ j = parse_body(body);
    if (is_chat) parse_chat_request(j);
    else parse_completion_request(j);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_FALSE(std::string(e.what()).empty());
    return e.param().empty() ? "<none>" : e.param();
  }
  ADD_FAILURE() << "accepted: " << body;
  return "";
}

TEST(RequestParse, MessagesAndContentParts) {
  auto r = parse_chat(R"({"model": "x", "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "f", "arguments": {"k": 1}}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "42"}]})");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content.value(), "ab");
  EXPECT_FALSE(r.messages[2].content.has_value());
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments_json, R"({"k":1})");
  EXPECT_EQ(r.messages[3].tool_call_id, "call_1");
  EXPECT_EQ(r.model, "x");
  EXPECT_TRUE(r.chat);
}

TEST(RequestParse, OmittedAndNullFieldsStayUnset) {
  auto r = parse_chat(R"({"messages": [{"role": "user", "content": "hi"}], "temperature": null, "stop": null})");
  EXPECT_FALSE(r.sampling.temperature);
  EXPECT_FALSE(r.sampling.top_p);
  EXPECT_FALSE(r.sampling.top_k);
  EXPECT_FALSE(r.sampling.seed);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.stream);
}

TEST(RequestParse, FieldsMapToNativeValues) {
  auto r = parse_chat(R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "max_completion_tokens": 20,
      "temperature": 0, "top_p": 0.5, "top_k": 40, "min_p": 0.1, "seed": -3, "repetition_penalty": 1.1,
      "presence_penalty": -2, "frequency_penalty": 2, "stop": ["a", "", "b"], "stream": true,
      "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3, "n": 1,
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}],
      "tool_choice": "none", "adapter": "mine", "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_EQ(r.max_tokens.value(), 20);  // max_completion_tokens wins
  EXPECT_EQ(r.sampling.temperature.value(), 0.0);
  EXPECT_EQ(r.sampling.top_p.value(), 0.5);
  EXPECT_EQ(r.sampling.top_k.value(), 40);
  EXPECT_EQ(r.sampling.min_p.value(), 0.1);
  EXPECT_EQ(r.sampling.seed.value(), -3);
  EXPECT_EQ(r.sampling.repetition_penalty.value(), 1.1);
  EXPECT_EQ(r.sampling.presence_penalty.value(), -2);
  EXPECT_EQ(r.sampling.frequency_penalty.value(), 2);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(r.tool_choice, "none");
  EXPECT_FALSE(r.tools_active());
  // Tools are kept verbatim, key order included (the chat template serializes them).
  EXPECT_EQ(r.tools.dump(), R"([{"type":"function","function":{"name":"f","parameters":{"z":1,"a":2}}}])");
  EXPECT_EQ(r.adapter.value(), "mine");
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);
}

TEST(RequestParse, StopAsStringAndCompletions) {
  auto c = parse_completion_request(parse_body(R"({"prompt": "Once", "stop": "\n", "logprobs": 2, "max_tokens": 5})"));
  EXPECT_FALSE(c.chat);
  EXPECT_EQ(c.prompt, "Once");
  EXPECT_EQ(c.stop, (std::vector<std::string>{"\n"}));
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(c.top_logprobs, 2);
  EXPECT_EQ(c.max_tokens.value(), 5);
}

TEST(RequestParse, BadFieldsAreRejectedNamingTheField) {
  const std::string m = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(rejected_param("{"), "<none>");
  EXPECT_EQ(rejected_param("[1]"), "<none>");
  EXPECT_EQ(rejected_param("{}"), "messages");
  EXPECT_EQ(rejected_param(R"({"messages": []})"), "messages");
  EXPECT_EQ(rejected_param(R"({"messages": "hi"})"), "messages");
  EXPECT_EQ(rejected_param(R"({"messages": [{"role": "wizard", "content": "x"}]})"), "messages[0].role");
  EXPECT_EQ(rejected_param(R"({"messages": [{"content": "x"}]})"), "messages[0].role");
  EXPECT_EQ(rejected_param(R"({"messages": [{"role": "user"}]})"), "messages[0].content");
  EXPECT_EQ(rejected_param(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})"),
            "messages[0].content[0].type");
  EXPECT_EQ(rejected_param(R"({"messages": [{"role": "user", "content": 5}]})"), "messages[0].content");
  EXPECT_EQ(rejected_param("{" + m + R"(, "temperature": "hot"})"), "temperature");
  EXPECT_EQ(rejected_param("{" + m + R"(, "temperature": 2.01})"), "temperature");
  EXPECT_EQ(rejected_param("{" + m + R"(, "temperature": -0.1})"), "temperature");
  EXPECT_EQ(rejected_param("{" + m + R"(, "top_p": 1.5})"), "top_p");
  EXPECT_EQ(rejected_param("{" + m + R"(, "top_k": -1})"), "top_k");
  EXPECT_EQ(rejected_param("{" + m + R"(, "min_p": 2})"), "min_p");
  EXPECT_EQ(rejected_param("{" + m + R"(, "max_tokens": -1})"), "max_tokens");
  EXPECT_EQ(rejected_param("{" + m + R"(, "max_tokens": 0})"), "max_tokens");
  EXPECT_EQ(rejected_param("{" + m + R"(, "max_tokens": 1e12})"), "max_tokens");
  EXPECT_EQ(rejected_param("{" + m + R"(, "max_tokens": 99999999999999999999999})"), "max_tokens");
  EXPECT_EQ(rejected_param("{" + m + R"(, "max_tokens": 1.5})"), "max_tokens");
  EXPECT_EQ(rejected_param("{" + m + R"(, "max_completion_tokens": "10"})"), "max_completion_tokens");
  EXPECT_EQ(rejected_param("{" + m + R"(, "n": 1.5})"), "n");
  EXPECT_EQ(rejected_param("{" + m + R"(, "stream": "yes"})"), "stream");
  EXPECT_EQ(rejected_param("{" + m + R"(, "stop": 5})"), "stop");
  EXPECT_EQ(rejected_param("{" + m + R"(, "stop": ["a", 1]})"), "stop[1]");
  EXPECT_EQ(rejected_param("{" + m + R"(, "seed": 1.5})"), "seed");
  EXPECT_EQ(rejected_param("{" + m + R"(, "presence_penalty": 3})"), "presence_penalty");
  EXPECT_EQ(rejected_param("{" + m + R"(, "logit_bias": [1]})"), "logit_bias");
  EXPECT_EQ(rejected_param("{" + m + R"(, "logit_bias": {"x": 1}})"), "logit_bias");
  EXPECT_EQ(rejected_param("{" + m + R"(, "logit_bias": {"-1": 1}})"), "logit_bias");
  EXPECT_EQ(rejected_param("{" + m + R"(, "logit_bias": {"5": 101}})"), "logit_bias");
  EXPECT_EQ(rejected_param("{" + m + R"(, "logit_bias": {"5": "1"}})"), "logit_bias");
  EXPECT_EQ(rejected_param("{" + m + R"(, "frequency_penalty": -2.5})"), "frequency_penalty");
  EXPECT_EQ(rejected_param("{" + m + R"(, "repetition_penalty": 0})"), "repetition_penalty");
  EXPECT_EQ(rejected_param("{" + m + R"(, "logprobs": 1})"), "logprobs");
  EXPECT_EQ(rejected_param("{" + m + R"(, "logprobs": true, "top_logprobs": 21})"), "top_logprobs");
  EXPECT_EQ(rejected_param("{" + m + R"(, "top_logprobs": 2})"), "top_logprobs");
  EXPECT_EQ(rejected_param("{" + m + R"(, "tools": {}})"), "tools");
  EXPECT_EQ(rejected_param("{" + m + R"(, "tools": [{"type": "function", "function": {}}]})"), "tools[0].function.name");
  EXPECT_EQ(rejected_param("{" + m + R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]})"),
            "tools[0].function.parameters");
  EXPECT_EQ(rejected_param("{" + m + R"(, "tool_choice": "always"})"), "tool_choice");
  EXPECT_EQ(rejected_param("{" + m + R"(, "stream_options": {"include_usage": 1}})"), "stream_options.include_usage");
  EXPECT_EQ(rejected_param("{" + m + R"(, "model": 3})"), "model");
  EXPECT_EQ(rejected_param(R"({"prompt": ["a", "b"]})", false), "prompt");
  EXPECT_EQ(rejected_param(R"({"prompt": ""})", false), "prompt");
  EXPECT_EQ(rejected_param(R"({})", false), "prompt");
  EXPECT_EQ(rejected_param(R"({"prompt": "a", "logprobs": 6})", false), "logprobs");
  EXPECT_EQ(rejected_param(R"({"prompt": "a", "echo": true})", false), "echo");
  // Chat's top_logprobs on the legacy route is refused, not ignored (found ignored by helper h45).
  EXPECT_EQ(rejected_param(R"({"prompt": "a", "logprobs": 2, "top_logprobs": 3})", false), "top_logprobs");
  EXPECT_EQ(parse_completion_request(parse_body(R"({"prompt": "a", "logprobs": 2, "top_logprobs": null})")).top_logprobs, 2);
}

// vLLM answers 400 "suffix is not currently supported"; silently dropping it would give the client
// a completion that ignores the text it asked to be continued into.
TEST(RequestParse, CompletionSuffixIsRefusedUnlessNull) {
  for (const char* suffix : {R"("tail")", R"("")", "3", "[]"}) {
    const std::string body = std::string(R"({"prompt": "a", "suffix": )") + suffix + "}";
    try {
      parse_completion_request(parse_body(body));
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << body;
      EXPECT_EQ(e.param(), "suffix") << body;
      EXPECT_NE(std::string(e.what()).find("suffix is not currently supported"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_completion_request(parse_body(R"({"prompt": "a", "suffix": null})")).prompt, "a");
}

TEST(RequestParse, DeeplyNestedJsonIs400NamingTheField) {
  const std::string deep = std::string(15000, '[') + std::string(15000, ']');  // ~30 KB
  const std::string m = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(rejected_param("{" + m + R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": )" +
                           deep + "}}]}"),
            "tools[0].function.parameters[0][0][0][0]…");
  EXPECT_EQ(rejected_param("{" + m + R"(, "chat_template_kwargs": {"x": )" + deep + "}}"),
            "chat_template_kwargs.x[0][0][0][0][0][0]…");
  EXPECT_EQ(rejected_param(R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function":
      {"name": "f", "arguments": )" + deep + "}}]}]}"),
            "messages[0].tool_calls[0].function.arguments[0][0]…");
  // Arguments as a JSON *string* are parsed for the template later: refused here too.
  EXPECT_EQ(rejected_param(R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function":
      {"name": "f", "arguments": ")" + deep + R"("}}]}]})"),
            "messages[0].tool_calls[0].function.arguments");
  try {
    parse_body("{" + m + R"(, "tools": )" + deep + "}");
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("JSON nested deeper than 128 levels"), std::string::npos) << e.what();
  }
  // 100 levels are fine.
  const std::string ok = std::string(100, '[') + std::string(100, ']');
  auto r = parse_chat("{" + m + R"(, "chat_template_kwargs": {"x": )" + ok + "}}");
  EXPECT_TRUE(r.chat_template_kwargs.contains("x"));
}


// OpenAI's "array of tokens" prompt for /v1/completions: one prompt as ids (or one prompt in a
// list); a batch of prompts, a non-integer or a negative id is a 400 naming the element.
TEST(RequestParse, CompletionPromptAsTokenIds) {
  auto c = parse_completion_request(parse_body(R"({"prompt": [1, 22, 333], "max_tokens": 2})"));
  EXPECT_EQ(c.prompt_ids, (std::vector<int64_t>{1, 22, 333}));
  EXPECT_TRUE(c.prompt.empty());
  EXPECT_EQ(rejected_param(R"({"prompt": [1, "a"]})", false), "prompt[1]");
  EXPECT_EQ(rejected_param(R"({"prompt": [1, 2.5]})", false), "prompt[1]");
  EXPECT_EQ(rejected_param(R"({"prompt": [-1]})", false), "prompt[0]");
  EXPECT_EQ(rejected_param(R"({"prompt": ["a", "b"]})", false), "prompt");
  EXPECT_EQ(rejected_param(R"({"prompt": [[1, 2], [3]]})", false), "prompt");
  EXPECT_EQ(rejected_param(R"({"prompt": [[]]})", false), "prompt");
  EXPECT_EQ(rejected_param(R"({"prompt": [["a"]]})", false), "prompt");
  // One prompt in a list (LangChain, the legacy SDK) is that prompt, as text or as ids.
  EXPECT_EQ(parse_completion_request(parse_body(R"({"prompt": [[1, 2]]})")).prompt_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(parse_completion_request(parse_body(R"({"prompt": ["a b"]})")).prompt, "a b");
  EXPECT_EQ(rejected_param(R"({"prompt": []})", false), "prompt");
  EXPECT_EQ(rejected_param(R"({"prompt": [true]})", false), "prompt[0]");
  EXPECT_EQ(rejected_param(R"({"prompt": [{}]})", false), "prompt[0]");
  EXPECT_EQ(rejected_param(R"({"prompt": [18446744073709551615]})", false), "prompt[0]");
  try {
    parse_completion_request(parse_body(R"({"prompt": [18446744073709551615]})"));
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
}

// A number no double holds (nlohmann's out_of_range 406, not a parse_error) is the client's bad
// JSON: a 400 whose message does not echo a 5,000-digit literal whole.
TEST(RequestParse, NumberOverflowIsInvalidJson) {
  for (const std::string lit : {std::string("1e400"), std::string(5000, '9')}) {
    try {
      parse_body(R"({"messages": [{"role": "user", "content": "x"}], "temperature": )" + lit + "}");
      ADD_FAILURE() << "accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.code(), "invalid_json");
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("Invalid JSON body: number overflow", 0), 0u) << m;
      EXPECT_LT(m.size(), 300u);
    }
  }
}

// A NUL echoed from the request is written out: what() would otherwise end the message there.
TEST(RequestParse, ApiErrorKeepsTheMessagePastANul) {
  const ApiError e(400, std::string("The model `gpt") + '\0' + "-4` does not exist.", "model");
  EXPECT_EQ(std::string(e.what()), "The model `gpt\\x00-4` does not exist.");
}

TEST(RequestParse, IgnoreEosIsVllmsFlagAndRefusedWithAGrammar) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_FALSE(parse_chat("{" + msgs + "}").ignore_eos);
  EXPECT_TRUE(parse_chat("{" + msgs + R"(, "ignore_eos": true})").ignore_eos);
  EXPECT_TRUE(parse_completion_request(parse_body(R"({"prompt": "a", "ignore_eos": true})")).ignore_eos);
  EXPECT_EQ(rejected_param("{" + msgs + R"(, "ignore_eos": "yes"})"), "ignore_eos");
  EXPECT_EQ(rejected_param("{" + msgs + R"(, "ignore_eos": true, "response_format": {"type": "json_object"}})"),
            "ignore_eos");
  EXPECT_EQ(rejected_param(R"({"prompt": "a", "ignore_eos": true, "response_format": {"type": "json_object"}})", false),
            "ignore_eos");
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])";
  EXPECT_EQ(rejected_param("{" + msgs + ", " + tools + R"(, "tool_choice": "required", "ignore_eos": true})"),
            "ignore_eos");
  EXPECT_TRUE(parse_chat("{" + msgs + ", " + tools + R"(, "tool_choice": "auto", "ignore_eos": true})").ignore_eos);
}

}  // namespace
}  // namespace hearth::server
