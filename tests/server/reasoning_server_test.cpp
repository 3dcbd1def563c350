// Reasoning through the HTTP server, in process: a FakeEngine that pretends to be a think-tag
// model emits canned outputs; the thought comes back as message.reasoning_content (non-streamed)
// and delta.reasoning_content chunks (streamed), identical both ways, with tool calls, stop
// strings and logprobs around it; an engine without a reasoning format is unchanged.
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "server/fake_engine.h"
#include "server/server.h"

namespace hearth::server {
namespace {

using J = nlohmann::json;

class ReasoningServerTest : public ::testing::Test {
 protected:
  void start(chat::ReasoningFormat format) {
    FakeEngineOptions fo;
    fo.reasoning = format;
    engine_ = std::make_unique<FakeEngine>(fo);
    ServerOptions so;
    so.port = 0;
    server_ = std::make_unique<Server>(*engine_, so);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  // POST /v1/chat/completions; `extra` is spliced into the body object.
  httplib::Result post(const std::string& user, const std::string& extra) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(10, 0);
    std::string body = R"({"messages": [{"role": "user", "content": )" + J(user).dump() + "}]" + extra + "}";
    return c.Post("/v1/chat/completions", body, "application/json");
  }

  struct Answer {
    std::string reasoning, content, finish;
    bool has_reasoning_key = false;
    J tool_calls = J::array();
    size_t logprobs = 0, reasoning_chunks = 0;
  };
  Answer non_streamed(const std::string& user, const std::string& extra = "") {
    auto r = post(user, extra);
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    J j = J::parse(r->body);
    const J& msg = j["choices"][0]["message"];
    Answer a;
    a.has_reasoning_key = msg.contains("reasoning_content");
    if (a.has_reasoning_key) a.reasoning = msg["reasoning_content"].get<std::string>();
    if (msg["content"].is_string()) a.content = msg["content"].get<std::string>();
    if (msg.contains("tool_calls")) a.tool_calls = msg["tool_calls"];
    a.finish = j["choices"][0]["finish_reason"].get<std::string>();
    if (j["choices"][0]["logprobs"].is_object()) a.logprobs = j["choices"][0]["logprobs"]["content"].size();
    return a;
  }
  Answer streamed(const std::string& user, const std::string& extra = "") {
    auto r = post(user, R"(, "stream": true)" + extra);
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    Answer a;
    size_t pos = 0;
    while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
      size_t end = r->body.find("\n\n", pos);
      std::string ev = r->body.substr(pos + 6, end - pos - 6);
      pos = end;
      if (ev == "[DONE]") break;
      J j = J::parse(ev);
      const J& ch = j["choices"][0];
      const J& d = ch["delta"];
      if (d.contains("reasoning_content")) {
        a.has_reasoning_key = true;
        a.reasoning += d["reasoning_content"].get<std::string>();
        ++a.reasoning_chunks;
      }
      if (d.contains("content") && d["content"].is_string()) a.content += d["content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const auto& tc : d["tool_calls"]) a.tool_calls.push_back(tc);
      if (ch["finish_reason"].is_string()) a.finish = ch["finish_reason"].get<std::string>();
      if (ch["logprobs"].is_object()) a.logprobs += ch["logprobs"]["content"].size();
    }
    return a;
  }
  // Both ways, checked equal; returns the non-streamed answer.
  Answer both(const std::string& user, const std::string& extra = "") {
    Answer n = non_streamed(user, extra), s = streamed(user, extra);
    EXPECT_EQ(s.reasoning, n.reasoning) << user;
    EXPECT_EQ(s.content, n.content) << user;
    EXPECT_EQ(s.finish, n.finish) << user;
    EXPECT_EQ(s.tool_calls.size(), n.tool_calls.size()) << user;
    for (size_t i = 0; i < std::min(s.tool_calls.size(), n.tool_calls.size()); ++i)
      EXPECT_EQ(s.tool_calls[i]["function"], n.tool_calls[i]["function"]);
    EXPECT_EQ(s.logprobs, n.logprobs) << user;
    return n;
  }

  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

TEST_F(ReasoningServerTest, ThinkTagsComeBackAsReasoningContentStreamedAndNot) {
  start(chat::ReasoningFormat::ThinkTags);
  Answer a = both("emit:<think>\nThe user greets me; reply politely.\n</think>\n\nHello! How can I help?");
  EXPECT_TRUE(a.has_reasoning_key);
  EXPECT_EQ(a.reasoning, "The user greets me; reply politely.");
  EXPECT_EQ(a.content, "Hello! How can I help?");
  EXPECT_EQ(a.finish, "stop");
  // Streamed: the thought arrives in several reasoning chunks (3 characters per fake token) and
  // no chunk carries a marker.
  Answer s = streamed("emit:<think>\nThe user greets me; reply politely.\n</think>\n\nHello! How can I help?");
  EXPECT_GT(s.reasoning_chunks, 5u);
  EXPECT_EQ(s.reasoning.find("think>"), std::string::npos);
  EXPECT_EQ(s.content.find("think>"), std::string::npos);
}

TEST_F(ReasoningServerTest, PrimedPromptOutputShowsOnlyTheClosingTag) {
  start(chat::ReasoningFormat::ThinkTags);
  Answer a = both("emit:pondering deeply</think>\n\nYes.", R"(, "chat_template_kwargs": {"enable_thinking": true})");
  EXPECT_EQ(a.reasoning, "pondering deeply");
  EXPECT_EQ(a.content, "Yes.");
  // Malformed: no closing tag at all -> everything is reasoning, the content is empty.
  a = both("emit:still thinking when the limit hit", R"(, "chat_template_kwargs": {"enable_thinking": true})");
  EXPECT_EQ(a.reasoning, "still thinking when the limit hit");
  EXPECT_EQ(a.content, "");
  // Not primed: the same text is all content.
  a = both("emit:pondering deeply</think>\n\nYes.");
  EXPECT_FALSE(a.has_reasoning_key);
  EXPECT_EQ(a.content, "pondering deeply\n\nYes.");
}

TEST_F(ReasoningServerTest, StructuredOutputAfterAPrimedThoughtIsTheContent) {
  // A response_format grammar starts at the first generated token and never allows the closing
  // marker: after a template that primed "<think>" (Qwen3.5's default) the JSON is the answer,
  // not a thought that never ends (it came back as reasoning_content with an empty content).
  start(chat::ReasoningFormat::ThinkTags);
  const std::string thinking = R"(, "chat_template_kwargs": {"enable_thinking": true})";
  for (const std::string format : {R"({"type": "json_object"})",
                                   R"({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})"}) {
    Answer a = both(R"(emit:{"a": 1})", thinking + R"(, "response_format": )" + format);
    EXPECT_FALSE(a.has_reasoning_key) << format;
    EXPECT_EQ(a.content, R"({"a": 1})") << format;
  }
  // Qwen's "<think>" is not a special token, so the grammar lets it into a JSON string: there it
  // is text (it moved the rest of the JSON into reasoning_content, leaving invalid JSON content).
  for (const std::string& extra : {thinking, std::string()}) {
    Answer a = both(R"(emit:{"a": "x<think>y</think>z<think>w"})", extra + R"(, "response_format": {"type": "json_object"})");
    EXPECT_FALSE(a.has_reasoning_key);
    EXPECT_EQ(a.content, R"({"a": "x<think>y</think>z<think>w"})");
  }
  // Without response_format the primed thought is still reasoning.
  Answer a = both(R"(emit:{"a": 1})", thinking);
  EXPECT_EQ(a.reasoning, R"({"a": 1})");
  EXPECT_EQ(a.content, "");
}

TEST_F(ReasoningServerTest, ToolCallAfterOrInsideAThoughtIsStillACall) {
  start(chat::ReasoningFormat::ThinkTags);
  const std::string tools =
      R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],)"
      R"( "chat_template_kwargs": {"enable_thinking": true})";
  const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
  for (const std::string& out : {"I need f.</think>\n\n" + call, "I need f. " + call /* unclosed thought */}) {
    Answer a = both("emit:" + out, tools);
    EXPECT_EQ(a.reasoning, "I need f.") << out;
    EXPECT_EQ(a.content, "") << out;
    ASSERT_EQ(a.tool_calls.size(), 1u) << out;
    EXPECT_EQ(a.tool_calls[0]["function"]["name"], "f");
    EXPECT_EQ(a.tool_calls[0]["function"]["arguments"], "{\"a\": 1}");
    EXPECT_EQ(a.finish, "tool_calls");
  }
  // A forced call is grammar-constrained from its first token: a "<think>" in its arguments is
  // text (it split the call between content and reasoning_content, and no call came back).
  const std::string forced = tools + R"(, "tool_choice": "required")";
  Answer f = both("emit:<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"x<think>y\"}}\n</tool_call>", forced);
  EXPECT_FALSE(f.has_reasoning_key);
  ASSERT_EQ(f.tool_calls.size(), 1u);
  EXPECT_EQ(f.tool_calls[0]["function"]["arguments"], "{\"a\": \"x<think>y\"}");
  EXPECT_EQ(f.finish, "tool_calls");
}

TEST_F(ReasoningServerTest, StopStringsApplyToTheAnswerOnlyAndLogprobsCoverEveryToken) {
  start(chat::ReasoningFormat::ThinkTags);
  Answer a = both("emit:<think>say STOP here</think>ok STOP more", R"(, "stop": ["STOP"], "logprobs": true)");
  EXPECT_EQ(a.reasoning, "say STOP here");
  EXPECT_EQ(a.content, "ok ");
  EXPECT_EQ(a.finish, "stop");
  // Every fake token up to the stop has a logprobs entry, thought tokens included.
  Answer full = both("emit:<think>abc</think>xyz", R"(, "logprobs": true)");
  EXPECT_EQ(full.logprobs, 7u);  // 21 characters, 3 per token
}

TEST_F(ReasoningServerTest, GemmaChannelMarkers) {
  start(chat::ReasoningFormat::Gemma4Channel);
  Answer a = both("emit:<|channel>thought\nThe user wants a haiku.<channel|>Autumn moonlight—");
  EXPECT_EQ(a.reasoning, "The user wants a haiku.");
  EXPECT_EQ(a.content, "Autumn moonlight—");
}

TEST_F(ReasoningServerTest, WithoutAReasoningFormatNothingChanges) {
  start(chat::ReasoningFormat::None);
  Answer a = both("emit:<think>x</think>y", R"(, "chat_template_kwargs": {"enable_thinking": true})");
  EXPECT_FALSE(a.has_reasoning_key);
  EXPECT_EQ(a.content, "<think>x</think>y");
  // Completions are never split, whatever the engine.
  TearDown();
  start(chat::ReasoningFormat::ThinkTags);
  httplib::Client c("127.0.0.1", port_);
  auto r = c.Post("/v1/completions", R"({"prompt": "emit:<think>x</think>y"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(J::parse(r->body)["choices"][0]["text"], "<think>x</think>y");
}

TEST_F(ReasoningServerTest, AssistantReasoningContentIsAcceptedForTheTemplate) {
  start(chat::ReasoningFormat::ThinkTags);
  httplib::Client c("127.0.0.1", port_);
  auto body = [](const std::string& key, const std::string& value) {
    return R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", ")" + key +
           "\": " + value + R"(}, {"role": "user", "content": "c"}]})";
  };
  auto r = c.Post("/v1/chat/completions", body("reasoning_content", "\"I thought.\""), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(engine_->last_request().messages[1].reasoning_content, std::optional<std::string>("I thought."));
  r = c.Post("/v1/chat/completions", body("reasoning", "\"Other name.\""), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(engine_->last_request().messages[1].reasoning_content, std::optional<std::string>("Other name."));
  r = c.Post("/v1/chat/completions", body("reasoning_content", "5"), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(J::parse(r->body)["error"]["param"], "messages[1].reasoning_content") << r->body;
}

}  // namespace
}  // namespace hearth::server
