// The HTTP server end to end, in process: FakeEngine + Server on an ephemeral port, driven by
// cpp-httplib's client. Routes, SSE framing, errors and their statuses, auth, limits, queueing,
// disconnects and shutdown. Transport and access checks: server_transport_test.cpp,
// server_access_test.cpp.
#include <atomic>
#include <chrono>
#include <thread>

#include "server_test_util.h"

namespace hearth::server {
namespace {

using namespace hearth::server::testing;

TEST_F(ServerTest, HealthIsExactlyTheMlxLmBody) {
  start();
  auto r = client().Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "{\"status\": \"ok\"}");
}

TEST_F(ServerTest, ModelsListsTheServedModel) {
  start({}, FakeEngineOptions{"tiny-llama", 2048, 0});
  auto r = client().Get("/v1/models");
  ASSERT_TRUE(r);
  J j = J::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny-llama");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["context_window"], 2048);
  EXPECT_EQ(client().Get("/v1/models/tiny-llama")->status, 200);
  expect_error(client().Get("/v1/models/other"), 404, "model");
}

TEST_F(ServerTest, ChatNonStreaming) {
  start();
  auto r = post("/v1/chat/completions", chat_body("hello there world"));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  J j = J::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["model"], "fake-model");  // the served id
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "hello there world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  // Prompt "user: hello there world\nassistant:" = 5 fake tokens; 3 words + EOS generated.
  EXPECT_EQ(j["usage"], (J{{"prompt_tokens", 5}, {"completion_tokens", 4}, {"total_tokens", 9}, {"prompt_tokens_details", {{"cached_tokens", 0}}}}));
}

TEST_F(ServerTest, ChatStreamingFramingAndAgreementWithNonStreaming) {
  start();
  auto r = post("/v1/chat/completions", chat_body("one two three four", R"(, "stream": true)"));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  auto evs = sse_events(r->body);
  ASSERT_GE(evs.size(), 3u);
  EXPECT_EQ(evs[0]["choices"][0]["delta"], (J{{"role", "assistant"}, {"content", ""}}));
  std::string content;
  for (size_t i = 0; i < evs.size(); ++i) {
    EXPECT_EQ(evs[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(evs[i]["id"], evs[0]["id"]);
    EXPECT_EQ(evs[i]["model"], "fake-model");
    EXPECT_FALSE(evs[i].contains("usage"));  // no include_usage
    ASSERT_EQ(evs[i]["choices"].size(), 1u);
    auto& c = evs[i]["choices"][0];
    if (i + 1 < evs.size()) EXPECT_TRUE(c["finish_reason"].is_null());
    if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(evs.back()["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(evs.back()["choices"][0]["delta"], J::object());
  EXPECT_EQ(content, "one two three four");
  EXPECT_EQ(evs.size(), 1u + 4u + 1u);  // role chunk, one per token, finish chunk
}

TEST_F(ServerTest, IncludeUsageAddsAFinalUsageChunk) {
  start();
  auto r = post("/v1/chat/completions",
                chat_body("a b", R"(, "stream": true, "stream_options": {"include_usage": true})"));
  auto evs = sse_events(r->body);
  ASSERT_GE(evs.size(), 2u);
  const J& last = evs.back();
  EXPECT_EQ(last["choices"], J::array());
  EXPECT_EQ(last["usage"], (J{{"prompt_tokens", 4}, {"completion_tokens", 3}, {"total_tokens", 7}, {"prompt_tokens_details", {{"cached_tokens", 0}}}}));
  for (size_t i = 0; i + 1 < evs.size(); ++i) EXPECT_TRUE(evs[i]["usage"].is_null()) << evs[i];
  EXPECT_EQ(evs[evs.size() - 2]["choices"][0]["finish_reason"], "stop");
}

TEST_F(ServerTest, CompletionsNonStreamingAndStreaming) {
  start();
  auto r = post("/v1/completions", R"({"prompt": "alpha beta gamma", "max_tokens": 2})");
  ASSERT_EQ(r->status, 200) << r->body;
  J j = J::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["text"], "alpha beta");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);

  auto s = post("/v1/completions", R"({"prompt": "alpha beta gamma", "stream": true})");
  auto evs = sse_events(s->body);
  std::string text;
  for (auto& e : evs) {
    EXPECT_EQ(e["object"], "text_completion");
    text += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "alpha beta gamma");
  EXPECT_EQ(evs.back()["choices"][0]["finish_reason"], "stop");
}

TEST_F(ServerTest, MaxTokensLimitsAndMaxCompletionTokensWins) {
  start();
  J j = J::parse(post("/v1/chat/completions", chat_body("a b c d e", R"(, "max_tokens": 2)"))->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "a b");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  j = J::parse(post("/v1/chat/completions", chat_body("a b c d e", R"(, "max_tokens": 2, "max_completion_tokens": 3)"))->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "a b c");
  EXPECT_EQ(engine_->last_request().max_tokens.value(), 3);
}

TEST_F(ServerTest, MaxTokensBeyondTheContextIs400NotClamped) {
  start({}, FakeEngineOptions{"fake-model", 10, 0});
  // Prompt "user: a b\nassistant:" is 4 tokens; 10 - 4 = 6 may be generated.
  for (const char* field : {"max_tokens", "max_completion_tokens"}) {
    auto r = post("/v1/chat/completions", chat_body("a b", std::string(", \"") + field + "\": 7"));
    expect_error(r, 400, field, "context_length_exceeded");  // the field the client sent
    const std::string msg = J::parse(r->body)["error"]["message"];
    EXPECT_NE(msg.find("too large: 7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("context length is 10 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("prompt has 4 tokens"), std::string::npos) << msg;
  }
  expect_error(post("/v1/chat/completions", chat_body("a b", R"(, "max_tokens": 1000, "stream": true)")), 400,
               "max_tokens");
  expect_error(post("/v1/completions", R"({"prompt": "a b c d", "max_tokens": 7})"), 400, "max_tokens");
  EXPECT_EQ(engine_->generations(), 0);
  // Exactly the room left is fine.
  ASSERT_EQ(post("/v1/chat/completions", chat_body("a b", R"(, "max_tokens": 6)"))->status, 200);
  EXPECT_EQ(engine_->last_request().max_tokens.value(), 6);
  // Omitted: chat fills the context (--max-tokens 0), completions take min(512, room).
  ASSERT_EQ(post("/v1/chat/completions", chat_body("a b"))->status, 200);
  EXPECT_EQ(engine_->last_request().max_tokens.value(), 6);
  ASSERT_EQ(post("/v1/completions", R"({"prompt": "a b c"})")->status, 200);
  EXPECT_EQ(engine_->last_request().max_tokens.value(), 7);
}

TEST_F(ServerTest, ServerDefaultMaxTokensIsACapClampedToTheRoom) {
  ServerOptions o;
  o.default_max_tokens = 3;
  start(o, FakeEngineOptions{"fake-model", 6, 0});
  ASSERT_EQ(post("/v1/chat/completions", chat_body("a"))->status, 200);  // 3 prompt tokens, room 3
  EXPECT_EQ(engine_->last_request().max_tokens.value(), 3);
  ASSERT_EQ(post("/v1/chat/completions", chat_body("a b"))->status, 200);  // room 2: the default is lowered
  EXPECT_EQ(engine_->last_request().max_tokens.value(), 2);
}

TEST_F(ServerTest, SamplingFieldsReachTheEngineAndOmittedOnesStayUnset) {
  start();
  auto r = post("/v1/chat/completions", chat_body("x", R"(, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
      "min_p": 0.05, "seed": 7, "repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": -0.5)"));
  ASSERT_EQ(r->status, 200);
  auto s = engine_->last_request().sampling;
  EXPECT_EQ(s.temperature.value(), 0.5);
  EXPECT_EQ(s.top_p.value(), 0.9);
  EXPECT_EQ(s.top_k.value(), 40);
  EXPECT_EQ(s.min_p.value(), 0.05);
  EXPECT_EQ(s.seed.value(), 7);
  EXPECT_EQ(s.repetition_penalty.value(), 1.2);
  EXPECT_EQ(s.presence_penalty.value(), 0.5);
  EXPECT_EQ(s.frequency_penalty.value(), -0.5);
  post("/v1/chat/completions", chat_body("x"));
  auto u = engine_->last_request().sampling;
  EXPECT_FALSE(u.temperature || u.top_p || u.top_k || u.min_p || u.seed || u.repetition_penalty ||
               u.presence_penalty || u.frequency_penalty);
}

TEST_F(ServerTest, StopStringsStreamedAndNonStreamedAgree) {
  start();
  // The fake engine emits 3 characters per token, so "END" straddles token boundaries.
  const std::string msg = "emit:The answer is 42. xxEND and more text";
  for (const char* stop : {R"("END")", R"(["zzz", "END", "more"])"}) {
    std::string extra = std::string(R"(, "stop": )") + stop;
    J j = J::parse(post("/v1/chat/completions", chat_body(msg, extra))->body);
    EXPECT_EQ(j["choices"][0]["message"]["content"], "The answer is 42. xx");
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    auto evs = sse_events(post("/v1/chat/completions", chat_body(msg, extra + R"(, "stream": true)"))->body);
    std::string streamed;
    for (auto& e : evs)
      if (e["choices"][0]["delta"].contains("content")) streamed += e["choices"][0]["delta"]["content"].get<std::string>();
    EXPECT_EQ(streamed, "The answer is 42. xx");
    EXPECT_EQ(evs.back()["choices"][0]["finish_reason"], "stop");
  }
  // Generation stopped at the stop string: the 8th of 14 tokens ("xxE", "ND ") completes "END".
  J j = J::parse(post("/v1/chat/completions", chat_body(msg, R"(, "stop": "END")"))->body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
}

TEST_F(ServerTest, PartialStopMatchIsReleasedAtTheEnd) {
  start();
  J j = J::parse(post("/v1/chat/completions", chat_body("emit:ends with EN", R"(, "stop": "END")"))->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "ends with EN");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST_F(ServerTest, LogprobsInOpenAiShapeStreamedAndNot) {
  start();
  J j = J::parse(post("/v1/chat/completions", chat_body("a bb c", R"(, "logprobs": true, "top_logprobs": 2)"))->body);
  const J& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  EXPECT_EQ(content[1]["token"], " bb");
  EXPECT_FLOAT_EQ(content[1]["logprob"].get<float>(), -1.0f);
  EXPECT_EQ(content[1]["bytes"], (J{32, 98, 98}));
  ASSERT_EQ(content[1]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[1]["top_logprobs"][1]["token"], "alt1");
  EXPECT_FLOAT_EQ(content[1]["top_logprobs"][1]["logprob"].get<float>(), -2.0f);
  EXPECT_EQ(content[1]["top_logprobs"][1]["bytes"], (J{97, 108, 116, 49}));

  auto evs = sse_events(post("/v1/chat/completions", chat_body("a bb c", R"(, "logprobs": true, "top_logprobs": 2, "stream": true)"))->body);
  J streamed = J::array();
  for (auto& e : evs)
    if (e["choices"][0]["logprobs"].is_object())
      for (auto& x : e["choices"][0]["logprobs"]["content"]) streamed.push_back(x);
  EXPECT_EQ(streamed, content);
}

// Completions' text_offset is each token's character offset in the whole text (OpenAI, vLLM): the
// same streamed (continued across chunks) and not. The fake engine emits 3 characters per token,
// some of them multi-byte.
TEST_F(ServerTest, CompletionTextOffsetsCountCharactersAndStreamedEqualsNonStreamed) {
  start();
  const std::string prompt = R"("prompt": "emit:héllo wörld ☃☃☃ ok!")";
  auto r = post("/v1/completions", "{" + prompt + R"(, "logprobs": 0})");
  ASSERT_EQ(r->status, 200) << r->body;
  const J whole = J::parse(r->body)["choices"][0];
  const J offsets = whole["logprobs"]["text_offset"];
  ASSERT_EQ(offsets.size(), 7u);  // 19 characters, 3 per token
  for (size_t i = 0; i < offsets.size(); ++i) EXPECT_EQ(offsets[i], 3 * i) << i;

  auto evs = sse_events(post("/v1/completions", "{" + prompt + R"(, "logprobs": 0, "stream": true})")->body);
  J streamed = J::array(), tokens = J::array();
  for (auto& e : evs)
    if (e["choices"][0]["logprobs"].is_object()) {
      for (auto& x : e["choices"][0]["logprobs"]["text_offset"]) streamed.push_back(x);
      for (auto& x : e["choices"][0]["logprobs"]["tokens"]) tokens.push_back(x);
    }
  EXPECT_EQ(streamed, offsets);
  EXPECT_EQ(tokens, whole["logprobs"]["tokens"]);
  for (size_t i = 1; i < streamed.size(); ++i) EXPECT_GT(streamed[i], streamed[i - 1]) << i;
}

const char* kTools = R"(, "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])";
const char* kToolEmit = R"(emit:Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>)";

TEST_F(ServerTest, ToolCallNonStreaming) {
  start();
  J j = J::parse(post("/v1/chat/completions", chat_body(kToolEmit, kTools))->body);
  const J& msg = j["choices"][0]["message"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(msg["content"], "Let me check. ");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(J::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()), (J{{"city", "Paris"}}));
}

TEST_F(ServerTest, ToolCallStreamingHidesTheBlockAndSendsToolCallsDelta) {
  start();
  auto evs = sse_events(post("/v1/chat/completions", chat_body(kToolEmit, std::string(kTools) + R"(, "stream": true)"))->body);
  std::string content;
  J calls;
  for (auto& e : evs) {
    const J& d = e["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) calls = d["tool_calls"];
  }
  EXPECT_EQ(content, "Let me check. ");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(J::parse(calls[0]["function"]["arguments"].get<std::string>()), (J{{"city", "Paris"}}));
  EXPECT_EQ(evs.back()["choices"][0]["finish_reason"], "tool_calls");
}

TEST_F(ServerTest, ToolChoiceNoneLeavesTextAlone) {
  start();
  J j = J::parse(post("/v1/chat/completions", chat_body(kToolEmit, std::string(kTools) + R"(, "tool_choice": "none")"))->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(j["choices"][0]["message"]["content"], std::string(kToolEmit).substr(5));
}

TEST_F(ServerTest, BadRequestsGet400InOpenAiShapeAndTheServerKeepsServing) {
  start();
  const std::string m = R"("messages": [{"role": "user", "content": "hi"}])";
  expect_error(post("/v1/chat/completions", "{not json"), 400);
  expect_error(post("/v1/chat/completions", "{}"), 400, "messages");
  expect_error(post("/v1/chat/completions", R"({"messages": [{"role": "robot", "content": "x"}]})"), 400, "messages[0].role");
  expect_error(post("/v1/chat/completions", "{" + m + R"(, "temperature": "warm"})"), 400, "temperature");
  expect_error(post("/v1/chat/completions", "{" + m + R"(, "temperature": 2.5})"), 400, "temperature");
  expect_error(post("/v1/chat/completions", "{" + m + R"(, "max_tokens": -5})"), 400, "max_tokens");
  expect_error(post("/v1/chat/completions", "{" + m + R"(, "max_tokens": 1e15})"), 400, "max_tokens");
  expect_error(post("/v1/chat/completions", "{" + m + R"(, "n": 0})"), 400, "n");
  expect_error(post("/v1/chat/completions", "{" + m + R"(, "adapter": "nope"})"), 400);  // engine's prepare()
  expect_error(post("/v1/completions", R"({"prompt": ["a", "b"]})"), 400, "prompt");
  expect_error(post("/v1/completions", R"({"prompt": "a", "suffix": " the end"})"), 400, "suffix");  // as vLLM
  auto r = post("/v1/chat/completions", chat_body("still alive"));
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(J::parse(r->body)["choices"][0]["message"]["content"], "still alive");
}

TEST_F(ServerTest, EngineFailureIs500OrAMidStreamErrorEvent) {
  start();
  expect_error(post("/v1/chat/completions", chat_body("a b c __fail_generate__")), 500);
  auto r = post("/v1/chat/completions", chat_body("a b c __fail_generate__", R"(, "stream": true)"));
  ASSERT_EQ(r->status, 200);  // headers were sent before the failure
  auto evs = sse_events(r->body, /*expect_done=*/false);
  ASSERT_GE(evs.size(), 3u);
  EXPECT_EQ(evs[1]["choices"][0]["delta"]["content"], "a");
  EXPECT_EQ(evs.back()["error"]["type"], "server_error");
  EXPECT_NE(evs.back()["error"]["message"].get<std::string>().find("failed on purpose"), std::string::npos);
  expect_error(post("/v1/chat/completions", chat_body("__bad_prompt__")), 400);
  EXPECT_EQ(post("/v1/chat/completions", chat_body("fine"))->status, 200);
}

TEST_F(ServerTest, UnknownRouteIs404AndWrongMethodIs405) {
  start();
  expect_error(client().Get("/v1/nothing"), 404);
  expect_error(post("/v2/chat", "{}"), 404);
  auto r = client().Get("/v1/chat/completions");
  expect_error(r, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  expect_error(client().Delete("/health"), 405);
  // A collection path with an empty id is no resource, not a method mismatch.
  expect_error(client().Get("/v1/models/"), 404);
  expect_error(client().Delete("/v1/adapters/"), 404);
}

TEST_F(ServerTest, ApiKeyIsRequiredOnV1RoutesWhenSet) {
  ServerOptions o;
  o.api_key = "s3cret";
  start(o);
  expect_error(post("/v1/chat/completions", chat_body("x")), 401);
  expect_error(post("/v1/chat/completions", chat_body("x"), {{"Authorization", "Bearer wrong"}}), 401);
  expect_error(client().Get("/v1/models"), 401);
  auto ok = post("/v1/chat/completions", chat_body("x"), {{"Authorization", "Bearer s3cret"}});
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(client().Get("/health")->status, 200);  // health and the UI stay open
  EXPECT_EQ(client().Get("/")->status, 200);
}

TEST_F(ServerTest, BodyTooLargeIs413) {
  ServerOptions o;
  o.max_body_bytes = 2048;
  start(o);
  expect_error(post("/v1/chat/completions", chat_body(std::string(4096, 'a'))), 413);
  EXPECT_EQ(post("/v1/chat/completions", chat_body("small"))->status, 200);
}

TEST_F(ServerTest, MissingEmptyOrTruncatedBodiesAre400WithoutWaiting) {
  ServerOptions o;
  o.read_timeout_s = 1;
  start(o);
  auto status_and_body = [](const std::string& reply) {
    std::pair<int, J> out{0, J()};
    if (reply.rfind("HTTP/1.1 ", 0) == 0) out.first = std::stoi(reply.substr(9, 3));
    size_t b = reply.find("\r\n\r\n");
    if (b != std::string::npos) out.second = J::parse(reply.substr(b + 4), nullptr, false);
    return out;
  };
  // No Content-Length and no Transfer-Encoding: no body (RFC 9112); answered at once.
  RawReply r = raw_exchange("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\r\n");
  auto [status, body] = status_and_body(r.text);
  EXPECT_EQ(status, 400) << r.text;
  EXPECT_EQ(body["error"]["code"], "invalid_json") << r.text;
  EXPECT_LT(r.first_byte, 500ms);
  // Content-Length: 0.
  auto e = post("/v1/chat/completions", "");
  expect_error(e, 400, "", "invalid_json");
  EXPECT_NE(J::parse(e->body)["error"]["message"].get<std::string>().find("empty"), std::string::npos) << e->body;
  expect_error(post("/v1/adapters", ""), 400);
  // A body shorter than its Content-Length: 400 once the (short) read timeout runs out.
  r = raw_exchange("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"messages\"");
  std::tie(status, body) = status_and_body(r.text);
  EXPECT_EQ(status, 400) << r.text;
  EXPECT_TRUE(body["error"]["message"].is_string()) << r.text;
  EXPECT_GE(r.first_byte, 800ms);
  EXPECT_LT(r.first_byte, 2500ms);
  // Body-less methods without Content-Length (curl -X DELETE) are not read at all.
  r = raw_exchange("DELETE /v1/adapters/ghost HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  std::tie(status, body) = status_and_body(r.text);
  EXPECT_EQ(status, 404) << r.text;
  EXPECT_LT(r.first_byte, 500ms);
  r = raw_exchange("DELETE /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(status_and_body(r.text).first, 405) << r.text;
  EXPECT_LT(r.first_byte, 500ms);
  EXPECT_EQ(post("/v1/chat/completions", chat_body("fine"))->status, 200);
}

TEST_F(ServerTest, AdapterRouteErrorsCarryParamAndCode) {
  start();
  // The fake engine mounts nothing: unmount of any id is a 404 from the engine thread.
  expect_error(client().Delete("/v1/adapters/ghost"), 404, "id", "adapter_not_found");
  expect_error(post("/v1/adapters", R"({"path": "/x"})"), 400, "id", "");
  expect_error(post("/v1/adapters", R"({"id": "a", "path": 3})"), 400, "path");
  expect_error(post("/v1/adapters", "[1]"), 400, "", "invalid_json");
  expect_error(post("/v1/adapters", R"({"id": "a", "path": "/x"})"), 501, "", "adapters_unsupported");
  expect_error(client().Put("/v1/adapters", "{}", "application/json"), 405);
  auto l = client().Get("/v1/adapters");
  ASSERT_EQ(l->status, 200);
  EXPECT_EQ(J::parse(l->body)["adapters"], J::array());
}

TEST_F(ServerTest, PromptLongerThanTheContextIs400ContextLengthExceeded) {
  // OpenAI and vLLM: 400, type invalid_request_error, code context_length_exceeded, the input as param.
  start({}, FakeEngineOptions{"fake-model", 8, 0});
  for (const char* extra : {"", R"(, "stream": true)"}) {
    auto r = post("/v1/chat/completions", chat_body("one two three four five six seven", extra));
    expect_error(r, 400, "messages", "context_length_exceeded");
    EXPECT_EQ(J::parse(r->body)["error"]["type"], "invalid_request_error");
    const std::string msg = J::parse(r->body)["error"]["message"];
    EXPECT_NE(msg.find("maximum context length is 8 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("resulted in 9 tokens"), std::string::npos) << msg;
  }
  expect_error(post("/v1/completions", R"({"prompt": "a b c d e f g h"})"), 400, "prompt", "context_length_exceeded");
  EXPECT_EQ(engine_->generations(), 0);
  EXPECT_EQ(post("/v1/chat/completions", chat_body("one"))->status, 200);
}

TEST_F(ServerTest, FullQueueIs429) {
  ServerOptions o;
  o.max_queue = 1;
  start(o, FakeEngineOptions{"fake-model", 4096, 30});
  const std::string slow = chat_body("emit:" + std::string(60, 'x'));  // 20 tokens * 30 ms
  std::thread a([&] { EXPECT_EQ(post("/v1/chat/completions", slow)->status, 200); });
  for (int i = 0; i < 200 && !engine_->busy(); ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(engine_->busy());
  // One of b and c waits in the queue (200), the other finds it full (429).
  std::atomic<int> ok{0}, full{0};
  auto run = [&] {
    auto r = post("/v1/chat/completions", slow);
    ASSERT_TRUE(r);
    if (r->status == 200) ++ok;
    if (r->status == 429) {
      ++full;
      expect_error(r, 429);
      EXPECT_EQ(r->get_header_value("Retry-After"), "1");
    }
  };
  std::thread b(run), c(run);
  a.join();
  b.join();
  c.join();
  EXPECT_EQ(ok, 1);
  EXPECT_EQ(full, 1);
  engine_->set_token_delay_ms(0);
  EXPECT_EQ(post("/v1/chat/completions", chat_body("after"))->status, 200);
}

TEST_F(ServerTest, AQueuedStreamingRequestGetsItsHeadersAndFirstChunkAtOnce) {
  start({}, FakeEngineOptions{"fake-model", 4096, 40});
  const std::string slow = chat_body("emit:" + std::string(60, 'x'));  // 20 tokens * 40 ms
  std::thread a([&] { EXPECT_EQ(post("/v1/chat/completions", slow)->status, 200); });
  for (int i = 0; i < 200 && !engine_->busy(); ++i) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(engine_->busy());  // (not ASSERT: thread `a` must be joined below)
  // The engine runs one request at a time: this one waits ~800 ms in the queue, yet its response
  // starts (status 200 + the role chunk) long before that, so an idle-timeout proxy keeps it.
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<int64_t> first_bytes_ms{-1};
  std::string body;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.set_header("Content-Type", "application/json");
  req.body = chat_body("b c", R"(, "stream": true)");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (first_bytes_ms < 0)
      first_bytes_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    body.append(data, n);
    return true;
  };
  auto r = client().send(req);
  a.join();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_GE(first_bytes_ms.load(), 0);
  EXPECT_LT(first_bytes_ms.load(), 400) << "the first bytes waited for the queue";
  auto events = sse_events(body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
}

TEST_F(ServerTest, ClientDisconnectMidStreamStopsGeneration) {
  start({}, FakeEngineOptions{"fake-model", 4096, 20});
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.set_header("Content-Type", "application/json");
  req.body = chat_body("emit:" + std::string(300, 'y'), R"(, "stream": true)");  // 100 tokens, 2 s
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  auto t0 = std::chrono::steady_clock::now();
  client().send(req);
  for (int i = 0; i < 200 && (engine_->busy() || engine_->generations() == 0); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(engine_->busy());
  EXPECT_EQ(engine_->stopped_early(), 1);
  EXPECT_LT(engine_->tokens_emitted(), 20);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
  engine_->set_token_delay_ms(0);
  EXPECT_EQ(post("/v1/chat/completions", chat_body("next"))->status, 200);
}

TEST_F(ServerTest, StopEndsAStreamAndFailsQueuedRequestsPromptly) {
  ServerOptions o;
  start(o, FakeEngineOptions{"fake-model", 4096, 20});
  const std::string slow = chat_body("emit:" + std::string(300, 'z'), R"(, "stream": true)");
  std::optional<httplib::Result> ra, rb;
  std::thread a([&] { ra.emplace(post("/v1/chat/completions", slow)); });
  for (int i = 0; i < 200 && !engine_->busy(); ++i) std::this_thread::sleep_for(5ms);
  std::thread b([&] { rb.emplace(post("/v1/chat/completions", chat_body("queued"))); });
  std::this_thread::sleep_for(100ms);
  auto t0 = std::chrono::steady_clock::now();
  server_->stop();
  thread_.join();
  a.join();
  b.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2000ms);
  ASSERT_TRUE(ra && *ra);
  EXPECT_EQ((*ra)->status, 200);
  auto evs = sse_events((*ra)->body);  // cut short but well formed, ending in [DONE]
  EXPECT_LT(engine_->tokens_emitted(), 100);
  ASSERT_TRUE(rb && *rb);
  expect_error(*rb, 503);
  // The cut stream says so: finish_reason "abort", never "stop".
  ASSERT_GE(evs.size(), 2u);
  EXPECT_EQ(evs.back()["choices"][0]["finish_reason"], "abort");
}

TEST_F(ServerTest, StopDuringANonStreamingAnswerReportsAbortWithThePartialText) {
  start({}, FakeEngineOptions{"fake-model", 4096, 20});
  const std::string text(300, 'w');  // 100 tokens of "www", 2 s
  std::optional<httplib::Result> r;
  std::thread a([&] { r.emplace(post("/v1/chat/completions", chat_body("emit:" + text))); });
  for (int i = 0; i < 200 && engine_->tokens_emitted() < 5; ++i) std::this_thread::sleep_for(5ms);
  server_->stop();
  thread_.join();
  a.join();
  ASSERT_TRUE(r && *r);
  ASSERT_EQ((*r)->status, 200) << (*r)->body;
  J j = J::parse((*r)->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "abort");
  const std::string content = j["choices"][0]["message"]["content"];
  EXPECT_GE(content.size(), 15u);
  EXPECT_LT(content.size(), text.size());
  EXPECT_EQ(text.rfind(content, 0), 0u);  // a prefix of the full answer
  // Tokens sampled: the emitted ones, plus the one refused at the cut.
  EXPECT_GE(j["usage"]["completion_tokens"].get<int64_t>(), static_cast<int64_t>(content.size() / 3));
  EXPECT_LE(j["usage"]["completion_tokens"].get<int64_t>(), static_cast<int64_t>(content.size() / 3 + 1));
}

TEST_F(ServerTest, WebUiIsServed) {
  start();
  auto r = client().Get("/");
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(r->body.find("<title>Hearth chat</title>"), std::string::npos);
  auto js = client().Get("/app.js");
  ASSERT_EQ(js->status, 200);
  EXPECT_EQ(js->get_header_value("Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_NE(js->body.find("textContent"), std::string::npos);
  EXPECT_EQ(client().Get("/style.css")->status, 200);
  // Defence in depth: no framing by another site, no script but the page's own files, no sniffing.
  for (const httplib::Response* res : {&*r, &*js}) {
    EXPECT_EQ(res->get_header_value("Content-Security-Policy"),
              "default-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'");
    EXPECT_EQ(res->get_header_value("X-Frame-Options"), "DENY");
    EXPECT_EQ(res->get_header_value("X-Content-Type-Options"), "nosniff");
  }
}

}  // namespace
}  // namespace hearth::server
