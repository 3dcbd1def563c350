// The server's OpenAI `n` (several choices per request) over HTTP with the FakeEngine: choice
// indexes, one usage with the prompt once, streaming chunks per choice with one [DONE], the 400s
// naming `n`; and the per-request fields the other APIs share (adapter, the budget field's name).
// Not the shared prefill itself (engine_loop_choices_test.cpp runs the real model).
#include "server_test_util.h"

namespace hearth::server {
namespace {

using testing::J;
using testing::ServerTest;

class ChoicesServerTest : public ServerTest {};

TEST_F(ChoicesServerTest, ChatWithNReturnsNIndexedChoicesAndCountsThePromptOnce) {
  start();
  auto r = post("/v1/chat/completions", chat_body("a b", R"(, "n": 3)"));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  J j = J::parse(r->body);
  ASSERT_EQ(j["choices"].size(), 3u) << r->body;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["content"], "a b");
    EXPECT_EQ(j["choices"][i]["finish_reason"], "stop");
  }
  // "user: a b\nassistant:" = 4 prompt tokens once; 3 tokens (a, b, EOS) per choice.
  EXPECT_EQ(j["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(j["usage"]["completion_tokens"], 9);
  EXPECT_EQ(j["usage"]["total_tokens"], 13);
  EXPECT_EQ(engine_->generations(), 3);
  // n = 1 (and no n) keeps one choice.
  J one = J::parse(post("/v1/chat/completions", chat_body("a b", R"(, "n": 1)"))->body);
  ASSERT_EQ(one["choices"].size(), 1u);
  EXPECT_EQ(one["usage"]["completion_tokens"], 3);
}

TEST_F(ChoicesServerTest, EachChoiceHasItsOwnFinishReasonAndLogprobs) {
  start();
  J j = J::parse(post("/v1/completions", R"({"prompt": "a b c d", "n": 2, "max_tokens": 2, "logprobs": 1})")->body);
  ASSERT_EQ(j["choices"].size(), 2u) << j;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], "a b");
    EXPECT_EQ(j["choices"][i]["finish_reason"], "length");
    EXPECT_EQ(j["choices"][i]["logprobs"]["tokens"].size(), 2u) << j;
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
}

TEST_F(ChoicesServerTest, StreamingCarriesTheChoiceIndexAndEndsOnceAfterTheLastChoice) {
  start();
  auto r = post("/v1/chat/completions",
                chat_body("a b", R"(, "n": 2, "stream": true, "stream_options": {"include_usage": true})"));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto evs = sse_events(r->body);  // exactly one [DONE], at the end
  ASSERT_FALSE(evs.empty());
  std::string text[2];
  int roles[2] = {0, 0}, finishes[2] = {0, 0};
  for (size_t k = 0; k + 1 < evs.size(); ++k) {
    ASSERT_EQ(evs[k]["choices"].size(), 1u) << evs[k];
    const J& c = evs[k]["choices"][0];
    const int i = c["index"].get<int>();
    ASSERT_TRUE(i == 0 || i == 1) << evs[k];
    if (c["delta"].contains("role")) ++roles[i];
    if (c["delta"].contains("content")) text[i] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) {
      ++finishes[i];
      EXPECT_EQ(c["finish_reason"], "stop");
    }
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(roles[i], 1) << i;
    EXPECT_EQ(finishes[i], 1) << i;
    EXPECT_EQ(text[i], "a b") << i;
  }
  EXPECT_EQ(evs.back()["choices"], J::array());
  EXPECT_EQ(evs.back()["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(evs.back()["usage"]["completion_tokens"], 6);
}

TEST_F(ChoicesServerTest, BadNIsA400NamingN) {
  ServerOptions o;
  o.max_num_seqs = 4;
  start(o);
  expect_error(post("/v1/chat/completions", chat_body("hi", R"(, "n": 5)")), 400, "n");
  expect_error(post("/v1/chat/completions", chat_body("hi", R"(, "n": 0)")), 400, "n");
  expect_error(post("/v1/chat/completions", chat_body("hi", R"(, "n": 1.5)")), 400, "n");
  expect_error(post("/v1/chat/completions", chat_body("hi", R"(, "n": "2")")), 400, "n");
  expect_error(post("/v1/completions", R"({"prompt": "hi", "n": -1})"), 400, "n");
  EXPECT_EQ(engine_->generations(), 0);
  auto r = post("/v1/chat/completions", chat_body("hi", R"(, "n": 4)"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(ChoicesServerTest, BudgetErrorsNameTheFieldTheClientSent) {
  FakeEngineOptions fo;
  fo.context_length = 64;
  start({}, fo);
  expect_error(post("/v1/chat/completions", chat_body("hi", R"(, "max_tokens": 500)")), 400, "max_tokens",
               "context_length_exceeded");
  expect_error(post("/v1/chat/completions", chat_body("hi", R"(, "max_completion_tokens": 500)")), 400,
               "max_completion_tokens", "context_length_exceeded");
  auto r = post("/v1/responses", R"({"model": "fake-model", "input": "hi", "max_output_tokens": 500})");
  expect_error(r, 400, "max_output_tokens", "context_length_exceeded");
  EXPECT_NE(J::parse(r->body)["error"]["message"].get<std::string>().find("max_output_tokens"), std::string::npos) << r->body;
  // Anthropic's field is max_tokens (its error body has no param: the message names it).
  auto a = post("/v1/messages", R"({"model": "fake-model", "max_tokens": 500, "messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, 400) << a->body;
  EXPECT_NE(a->body.find("max_tokens is too large"), std::string::npos) << a->body;
}

TEST_F(ChoicesServerTest, MessagesAndResponsesHonourThePerRequestAdapter) {
  start();
  // The fake engine knows no adapter but "none": an unknown one is a 400 from prepare(), as on
  // chat/completions, instead of being ignored.
  auto m = post("/v1/messages",
                R"({"model": "fake-model", "max_tokens": 10, "adapter": "nope", "messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 400) << m->body;
  auto r = post("/v1/responses", R"({"model": "fake-model", "input": "hi", "adapter": "nope"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(engine_->generations(), 0);
  m = post("/v1/messages",
           R"({"model": "fake-model", "max_tokens": 10, "adapter": "none", "messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200) << m->body;
  EXPECT_EQ(engine_->last_request().adapter, std::optional<std::string>("none"));
  r = post("/v1/responses", R"({"model": "fake-model", "input": "hi", "adapter": "none"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(engine_->last_request().adapter, std::optional<std::string>("none"));
  // A wrong type names the field.
  expect_error(post("/v1/responses", R"({"model": "fake-model", "input": "hi", "adapter": 3})"), 400, "adapter");
}

}  // namespace
}  // namespace hearth::server
