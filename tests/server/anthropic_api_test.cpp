// Anthropic Messages (POST /v1/messages, /v1/messages/count_tokens) in process against the
// FakeEngine: request mapping into CompletionRequest, Message objects, streaming event order,
// thinking and tool_use blocks both ways, stop sequences, count_tokens, errors in Anthropic's shape.
#include <atomic>
#include <limits>

#include "server/anthropic_api.h"
#include "server/api_error.h"
#include "server/request_parse.h"
#include "server_test_util.h"

namespace hearth::server {
namespace {

using namespace hearth::server::testing;

CompletionRequest parse(const std::string& body, bool count_only = false) {
  return parse_anthropic_request(parse_body(body), count_only);
}

// The `param` of the ApiError that parsing `body` throws ("<accepted>" if none).
std::string refused(const std::string& body, bool count_only = false) {
  try {
    parse(body, count_only);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << body;
    return e.param();
  }
  return "<accepted>";
}

TEST(AnthropicParse, MapsSystemBlocksToolsAndOptions) {
  const CompletionRequest r = parse(R"({
    "model": "fake-model", "max_tokens": 300, "metadata": {"user_id": "u"},
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "Use tools."}],
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "weather?"}, {"type": "text", "text": "in Paris"}]},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "need the tool", "signature": ""},
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
        {"type": "text", "text": "and tomorrow?"}]}],
    "stop_sequences": ["END", ""], "temperature": 0.5, "top_p": 0.9, "top_k": 20,
    "tools": [{"name": "get_weather", "description": "Weather by city",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 1024}, "stream": true})");
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content.value(), "Be brief.\nUse tools.");
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[1].content.value(), "weather?\nin Paris");
  const ChatMessage& a = r.messages[2];
  EXPECT_EQ(a.role, "assistant");
  EXPECT_EQ(a.content.value(), "Let me look.");
  EXPECT_EQ(a.reasoning_content.value(), "need the tool");
  ASSERT_EQ(a.tool_calls.size(), 1u);
  EXPECT_EQ(a.tool_calls[0].id, "toolu_1");
  EXPECT_EQ(a.tool_calls[0].name, "get_weather");
  EXPECT_EQ(J::parse(a.tool_calls[0].arguments_json), J({{"city", "Paris"}}));
  EXPECT_EQ(r.messages[3].role, "tool");
  EXPECT_EQ(r.messages[3].tool_call_id, "toolu_1");
  EXPECT_EQ(r.messages[3].name, "get_weather");
  EXPECT_EQ(r.messages[3].content.value(), "sunny");
  EXPECT_EQ(r.messages[4].role, "user");
  EXPECT_EQ(r.messages[4].content.value(), "and tomorrow?");
  EXPECT_EQ(r.max_tokens.value(), 300);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_DOUBLE_EQ(r.sampling.temperature.value(), 0.5);
  EXPECT_DOUBLE_EQ(r.sampling.top_p.value(), 0.9);
  EXPECT_EQ(r.sampling.top_k.value(), 20);
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0]["type"], "function");
  EXPECT_EQ(r.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.tools[0]["function"]["description"], "Weather by city");
  EXPECT_EQ(r.tools[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
  EXPECT_EQ(r.tool_choice, "required");
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], true);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.model, "fake-model");
}

TEST(AnthropicParse, ToolChoiceThinkingAndStringContent) {
  const std::string m = R"("max_tokens": 5, "messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(parse("{" + m + R"(, "tool_choice": {"type": "tool", "name": "f"}})").tool_choice, "function");
  EXPECT_EQ(parse("{" + m + R"(, "tool_choice": {"type": "tool", "name": "f"}})").tool_choice_name, "f");
  EXPECT_EQ(parse("{" + m + R"(, "tool_choice": {"type": "none"}})").tool_choice, "none");
  EXPECT_EQ(parse("{" + m + R"(, "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}})").tool_choice, "auto");
  EXPECT_EQ(parse("{" + m + R"(, "thinking": {"type": "disabled"}})").chat_template_kwargs["enable_thinking"], false);
  EXPECT_FALSE(parse("{" + m + "}").chat_template_kwargs.contains("enable_thinking"));
  const CompletionRequest r = parse("{" + m + R"(, "system": "sys"})");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].content.value(), "sys");
  EXPECT_EQ(r.messages[1].content.value(), "hi");
  // A tool_result with string content and no matching tool_use: no name.
  const CompletionRequest t = parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "x", "content": "42"}]}]})");
  ASSERT_EQ(t.messages.size(), 1u);
  EXPECT_EQ(t.messages[0].role, "tool");
  EXPECT_EQ(t.messages[0].content.value(), "42");
  EXPECT_EQ(t.messages[0].name, "");
}

TEST(AnthropicParse, RefusesWhatItCannotServe) {
  const std::string u = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(refused("{" + u + "}"), "max_tokens");
  EXPECT_EQ(refused("{" + u + "}", /*count_only=*/true), "<accepted>");
  EXPECT_EQ(refused(R"({"max_tokens": 0, )" + u + "}"), "max_tokens");
  EXPECT_EQ(refused(R"({"max_tokens": 5})"), "messages");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": []})"), "messages");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})"),
            "messages[0].content[0].type");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})"), "messages[0].role");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "{"}]})"),
            "messages[1].role");  // prefill
  EXPECT_EQ(refused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]})"),
            "messages[0].content[0].type");  // tool_use belongs to the assistant
  EXPECT_EQ(refused(R"({"max_tokens": 5, "temperature": 1.5, )" + u + "}"), "temperature");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}], )" + u + "}"),
            "tools[0].type");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "tools": [{"name": "f"}], )" + u + "}"), "tools[0].input_schema");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "tool_choice": {"type": "tool"}, )" + u + "}"), "tool_choice.name");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "tool_choice": "auto", )" + u + "}"), "tool_choice");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "thinking": {"type": "sometimes"}, )" + u + "}"), "thinking.type");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "stop_sequences": "x", )" + u + "}"), "stop_sequences");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "system": [{"type": "image"}], )" + u + "}"), "system[0].type");
}

TEST(AnthropicParse, SeedIsAnExtensionParsedLikeChatCompletions) {
  const std::string u = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(parse(R"({"max_tokens": 5, "seed": 42, )" + u + "}").sampling.seed.value(), 42);
  EXPECT_EQ(parse(R"({"max_tokens": 5, "seed": -9223372036854775808, )" + u + "}").sampling.seed.value(),
            std::numeric_limits<int64_t>::min());
  EXPECT_FALSE(parse(R"({"max_tokens": 5, )" + u + "}").sampling.seed.has_value());
  EXPECT_EQ(refused(R"({"max_tokens": 5, "seed": "7", )" + u + "}"), "seed");
  EXPECT_EQ(refused(R"({"max_tokens": 5, "seed": 1.5, )" + u + "}"), "seed");
}

class AnthropicServerTest : public ServerTest {
 protected:
  httplib::Result messages(const std::string& body, const httplib::Headers& h = {}) { return post("/v1/messages", body, h); }
  static std::string body(const std::string& user, const std::string& extra = "") {
    return R"({"model": "fake-model", "max_tokens": 100, "messages": [{"role": "user", "content": )" + J(user).dump() + "}]" +
           extra + "}";
  }
  // An Anthropic error body with this status and error type.
  static void expect_anthropic_error(const httplib::Result& r, int status, const std::string& type) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    J j = J::parse(r->body);
    EXPECT_EQ(j["type"], "error") << r->body;
    EXPECT_EQ(j["error"]["type"], type) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string() && !j["error"]["message"].get<std::string>().empty()) << r->body;
    EXPECT_FALSE(j.contains("param")) << r->body;
  }
  // Streams `b` and returns its events.
  std::vector<std::pair<std::string, J>> stream(const std::string& b) {
    auto r = messages(b);
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    return named_sse_events(r->body);
  }
};

TEST_F(AnthropicServerTest, NonStreamingMessage) {
  start();
  auto r = messages(body("hello there"));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  J j = J::parse(r->body);
  EXPECT_EQ(j["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(j["type"], "message");
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_EQ(j["content"], J::parse(R"([{"type": "text", "text": "hello there"}])"));
  EXPECT_EQ(j["stop_reason"], "end_turn");
  EXPECT_TRUE(j["stop_sequence"].is_null());
  // "user: hello there\nassistant:" = 4 fake tokens; 2 words + EOS.
  EXPECT_EQ(j["usage"], J::parse(R"({"input_tokens": 4, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                                     "output_tokens": 3})"));
  EXPECT_EQ(engine_->last_request().max_tokens.value(), 100);
}

TEST_F(AnthropicServerTest, StopSequenceAndMaxTokens) {
  start();
  J j = J::parse(messages(body("emit:first line\nsecond line", R"(, "stop_sequences": ["zzz", "\n"])"))->body);
  EXPECT_EQ(j["content"][0]["text"], "first line");
  EXPECT_EQ(j["stop_reason"], "stop_sequence");
  EXPECT_EQ(j["stop_sequence"], "\n");
  j = J::parse(messages(R"({"max_tokens": 2, "messages": [{"role": "user", "content": "a b c d"}]})")->body);
  EXPECT_EQ(j["content"][0]["text"], "a b");
  EXPECT_EQ(j["stop_reason"], "max_tokens");
  EXPECT_TRUE(j["stop_sequence"].is_null());
  // Streamed: the same stop reason and sequence in message_delta.
  auto evs = stream(body("emit:first line\nsecond line", R"(, "stop_sequences": ["\n"], "stream": true)"));
  ASSERT_GE(evs.size(), 2u);
  const J& md = evs[evs.size() - 2].second;
  EXPECT_EQ(md["type"], "message_delta");
  EXPECT_EQ(md["delta"]["stop_reason"], "stop_sequence");
  EXPECT_EQ(md["delta"]["stop_sequence"], "\n");
}

TEST_F(AnthropicServerTest, StreamingEventOrderAndText) {
  start();
  auto evs = stream(body("one two three", R"(, "stream": true)"));
  std::vector<std::string> names;
  std::string text;
  for (const auto& [name, data] : evs) {
    names.push_back(name);
    if (name == "content_block_delta") {
      EXPECT_EQ(data["index"], 0);
      EXPECT_EQ(data["delta"]["type"], "text_delta");
      text += data["delta"]["text"].get<std::string>();
    }
  }
  const std::vector<std::string> want = {"message_start", "ping", "content_block_start", "content_block_delta",
                                         "content_block_delta", "content_block_delta", "content_block_stop",
                                         "message_delta", "message_stop"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(text, "one two three");
  const J& start_msg = evs[0].second["message"];
  EXPECT_EQ(start_msg["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(start_msg["content"], J::array());
  EXPECT_TRUE(start_msg["stop_reason"].is_null());
  EXPECT_EQ(start_msg["usage"]["input_tokens"], 5);
  EXPECT_EQ(evs[2].second["content_block"], J::parse(R"({"type": "text", "text": ""})"));
  EXPECT_EQ(evs[6].second["index"], 0);
  const J& md = evs[7].second;
  EXPECT_EQ(md["delta"]["stop_reason"], "end_turn");
  EXPECT_TRUE(md["delta"]["stop_sequence"].is_null());
  EXPECT_EQ(md["usage"]["output_tokens"], 4);
  EXPECT_EQ(md["usage"]["input_tokens"], 5);
}

// An output that is all thought (a primed thought never closed) is one thinking block, with no
// empty text block after it either way; an empty output alone is still one empty text block.
TEST_F(AnthropicServerTest, ThinkingOnlyOutputHasNoEmptyTextBlock) {
  FakeEngineOptions fo;
  fo.reasoning = chat::ReasoningFormat::ThinkTags;
  start({}, fo);
  const std::string thinking = R"(, "thinking": {"type": "enabled", "budget_tokens": 100})";
  J j = J::parse(messages(body("emit:still thinking", thinking))->body);
  ASSERT_EQ(j["content"].size(), 1u) << j.dump();
  EXPECT_EQ(j["content"][0]["type"], "thinking");
  EXPECT_EQ(j["content"][0]["thinking"], "still thinking");
  auto evs = stream(body("emit:still thinking", thinking + R"(, "stream": true)"));
  std::vector<std::string> blocks;
  for (const auto& [name, data] : evs)
    if (name == "content_block_start") blocks.push_back(data["content_block"]["type"].get<std::string>());
  EXPECT_EQ(blocks, std::vector<std::string>{"thinking"});
  J empty = J::parse(messages(body("emit:"))->body);
  EXPECT_EQ(empty["content"], J::parse(R"([{"type": "text", "text": ""}])")) << empty.dump();
  blocks.clear();
  for (const auto& [name, data] : stream(body("emit:", R"(, "stream": true)")))
    if (name == "content_block_start") blocks.push_back(data["content_block"]["type"].get<std::string>());
  EXPECT_EQ(blocks, std::vector<std::string>{"text"});
}

TEST_F(AnthropicServerTest, ThinkingAndToolUseBothWays) {
  FakeEngineOptions fo;
  fo.reasoning = chat::ReasoningFormat::ThinkTags;
  start({}, fo);
  const std::string tools =
      R"(, "thinking": {"type": "enabled", "budget_tokens": 100}, "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}])";
  const std::string user = R"(emit:plan it</think><tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>)";
  J j = J::parse(messages(body(user, tools))->body);
  ASSERT_EQ(j["content"].size(), 2u) << j.dump();
  EXPECT_EQ(j["content"][0], J::parse(R"({"type": "thinking", "thinking": "plan it", "signature": ""})"));
  const J& tu = j["content"][1];
  EXPECT_EQ(tu["type"], "tool_use");
  EXPECT_EQ(tu["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(tu["name"], "get_weather");
  EXPECT_EQ(tu["input"], J({{"city", "Paris"}}));
  EXPECT_EQ(j["stop_reason"], "tool_use");

  // Streamed: a thinking block, then a tool_use block whose input arrives as input_json_delta.
  auto evs = stream(body(user, tools + R"(, "stream": true)"));
  std::vector<std::string> names;
  std::string thinking, json_text;
  for (const auto& [name, data] : evs) {
    names.push_back(name);
    if (name == "content_block_delta" && data["delta"]["type"] == "thinking_delta") thinking += data["delta"]["thinking"].get<std::string>();
    if (name == "content_block_delta" && data["delta"]["type"] == "input_json_delta") {
      EXPECT_EQ(data["index"], 1);
      json_text += data["delta"]["partial_json"].get<std::string>();
    }
    if (name == "content_block_start" && data["index"] == 1) {
      EXPECT_EQ(data["content_block"]["type"], "tool_use");
      EXPECT_EQ(data["content_block"]["name"], "get_weather");
      EXPECT_EQ(data["content_block"]["input"], J::object());
    }
  }
  EXPECT_EQ(thinking, "plan it");
  EXPECT_EQ(J::parse(json_text), J({{"city", "Paris"}}));
  EXPECT_EQ(names.front(), "message_start");
  EXPECT_EQ(names.back(), "message_stop");
  EXPECT_EQ(std::count(names.begin(), names.end(), "content_block_start"), 2);
  EXPECT_EQ(std::count(names.begin(), names.end(), "content_block_stop"), 2);
  EXPECT_EQ(evs[evs.size() - 2].second["delta"]["stop_reason"], "tool_use");

  // The round trip: the tool_use goes back with its result, and the model sees a tool message.
  J next = J::parse(body("x"));
  next["messages"] = J::array({J{{"role", "user"}, {"content", "weather?"}},
                               J{{"role", "assistant"}, {"content", j["content"]}},
                               J{{"role", "user"}, {"content", J::array({J{{"type", "tool_result"}, {"tool_use_id", tu["id"]}, {"content", "sunny"}}})}}});
  J answer = J::parse(messages(next.dump())->body);
  EXPECT_EQ(answer["content"][0]["text"], "Tool result: sunny") << answer.dump();
  const CompletionRequest seen = engine_->last_request();
  ASSERT_EQ(seen.messages.size(), 3u);
  EXPECT_EQ(seen.messages[1].reasoning_content.value(), "plan it");
  ASSERT_EQ(seen.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(seen.messages[1].tool_calls[0].id, tu["id"].get<std::string>());
  EXPECT_EQ(seen.messages[2].role, "tool");
  EXPECT_EQ(seen.messages[2].tool_call_id, tu["id"].get<std::string>());
  EXPECT_EQ(seen.messages[2].name, "get_weather");
}

TEST_F(AnthropicServerTest, CountTokensBuildsThePromptWithoutGenerating) {
  start();
  auto r = post("/v1/messages/count_tokens", R"({"model": "fake-model", "system": "be nice",
      "messages": [{"role": "user", "content": "hello there"}]})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  // "system: be nice\nuser: hello there\nassistant:" = 7 fake tokens, as /v1/messages reports.
  EXPECT_EQ(J::parse(r->body), J({{"input_tokens", 7}}));
  EXPECT_EQ(engine_->generations(), 0);
  J j = J::parse(messages(R"({"max_tokens": 9, "system": "be nice", "messages": [{"role": "user", "content": "hello there"}]})")->body);
  EXPECT_EQ(j["usage"]["input_tokens"], 7);
  expect_anthropic_error(post("/v1/messages/count_tokens", R"({"model": "nope", "messages": [{"role": "user", "content": "x"}]})"),
                         404, "not_found_error");
  expect_anthropic_error(post("/v1/messages/count_tokens", R"({"messages": [{"role": "user", "content": "__bad_prompt__"}]})"),
                         400, "invalid_request_error");
  expect_anthropic_error(post("/v1/messages/count_tokens", R"({"messages": 3})"), 400, "invalid_request_error");
}

TEST_F(AnthropicServerTest, CountTokensRefusesTextThatCannotFitBeforeTemplating) {
  FakeEngineOptions fo;
  fo.context_length = 100;
  fo.max_token_bytes = 4;  // at most 400 bytes of text can fit
  start({}, fo);
  const std::string big = R"({"messages": [{"role": "user", "content": ")" + std::string(401, 'x') + R"("}]})";
  auto r = post("/v1/messages/count_tokens", big);
  expect_anthropic_error(r, 400, "invalid_request_error");
  EXPECT_NE(r->body.find("maximum context length is 100 tokens"), std::string::npos) << r->body;
  EXPECT_EQ(engine_->prepares(), 0);
  EXPECT_EQ(post("/v1/messages/count_tokens", R"({"messages": [{"role": "user", "content": "a b"}]})")->body,
            R"({"input_tokens":4})");
}

TEST_F(AnthropicServerTest, ErrorsComeInAnthropicShape) {
  ServerOptions o;
  o.api_key = "sekret";
  start(o);
  const httplib::Headers key = {{"x-api-key", "sekret"}};
  expect_anthropic_error(messages(body("hi")), 401, "authentication_error");
  expect_anthropic_error(messages(body("hi"), {{"x-api-key", "wrong"}}), 401, "authentication_error");
  EXPECT_EQ(messages(body("hi"), key)->status, 200);
  EXPECT_EQ(messages(body("hi"), {{"Authorization", "Bearer sekret"}})->status, 200);
  expect_anthropic_error(messages(R"({"messages": [{"role": "user", "content": "hi"}]})", key), 400, "invalid_request_error");
  expect_anthropic_error(messages(R"({"max_tokens": 3, "model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]})", key),
                         404, "not_found_error");
  expect_anthropic_error(messages("{not json", key), 400, "invalid_request_error");
  expect_anthropic_error(messages(body("__bad_prompt__"), key), 400, "invalid_request_error");
  expect_anthropic_error(client().Get("/v1/messages", key), 405, "invalid_request_error");
  // The OpenAI routes keep OpenAI's shape.
  expect_error(post("/v1/chat/completions", chat_body("hi"), {{"x-api-key", "wrong"}}), 401, "", "invalid_api_key");
}

TEST_F(AnthropicServerTest, FailureMidStreamIsAnErrorEvent) {
  start();
  auto evs = stream(body("__fail_generate__ a b c", R"(, "stream": true)"));
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.front().first, "message_start");
  EXPECT_EQ(evs.back().first, "error");
  EXPECT_EQ(evs.back().second["error"]["type"], "api_error");
  // Before any output the status says it: a 500 in Anthropic's shape.
  expect_anthropic_error(messages(body("__fail_generate__ a b")), 500, "api_error");
}

TEST_F(AnthropicServerTest, FullQueueIsARateLimitError) {
  ServerOptions o;
  o.max_queue = 1;
  start(o, FakeEngineOptions{"fake-model", 4096, 30});
  const std::string slow = body("emit:" + std::string(60, 'x'));  // 20 tokens * 30 ms
  std::thread a([&] { EXPECT_EQ(messages(slow)->status, 200); });
  for (int i = 0; i < 200 && !engine_->busy(); ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(engine_->busy());
  std::atomic<int> ok{0}, limited{0};
  auto run = [&] {
    auto r = messages(slow);
    ASSERT_TRUE(r);
    if (r->status == 200) ++ok;
    if (r->status == 429) {
      ++limited;
      expect_anthropic_error(r, 429, "rate_limit_error");
    }
  };
  std::thread b(run), c(run);
  a.join();
  b.join();
  c.join();
  EXPECT_EQ(ok, 1);
  EXPECT_EQ(limited, 1);
}

}  // namespace
}  // namespace hearth::server
