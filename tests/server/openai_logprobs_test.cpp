// OpenAI logprobs on the wire (server/openai_format.h): a ruled-out token's -inf is a number, and
// completions' {text: logprob} map keeps the more likely of two tokens that print alike.
#include <gtest/gtest.h>

#include <cmath>

#include "server/openai_format.h"

namespace hearth::server {
namespace {

StreamEvent delta_with_logprobs() {
  TokenEvent t;
  t.id = 7;
  t.token = t.text = "u";
  t.logprob = -0.01f;
  t.top_logprobs = {{7, "u", -0.01f, {}}, {9, "ue", -4.6f, {}}, {8, "u", -8.875f, {}}, {3, "<unk>", -INFINITY, {}}};
  StreamEvent ev;
  ev.kind = StreamEvent::Kind::kDelta;
  ev.text = "u";
  ev.logprobs = {t};
  return ev;
}

TEST(OpenAiLogprobs, CompletionsMapKeepsTheMoreLikelyOfTokensThatPrintAlikeAndNoNulls) {
  ResponseMeta m;
  m.chat = false;
  m.logprobs = true;
  const ojson lp = delta_chunk(m, delta_with_logprobs())["choices"][0]["logprobs"];
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][0].get<double>(), static_cast<double>(-0.01f));
  const ojson& top = lp["top_logprobs"][0];
  ASSERT_EQ(top.size(), 3u);  // "u" twice in the list: one key
  EXPECT_DOUBLE_EQ(top["u"].get<double>(), static_cast<double>(-0.01f));
  EXPECT_DOUBLE_EQ(top["ue"].get<double>(), static_cast<double>(-4.6f));
  ASSERT_TRUE(top["<unk>"].is_number());
  EXPECT_EQ(top["<unk>"].get<double>(), -9999.0);
  EXPECT_EQ(top.begin().key(), "u");  // most likely first, as listed
}

TEST(OpenAiLogprobs, ChatEntriesClampMinusInfinityToANumber) {
  ResponseMeta m;
  m.chat = true;
  m.logprobs = true;
  const ojson content = delta_chunk(m, delta_with_logprobs())["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 1u);
  const ojson& top = content[0]["top_logprobs"];
  ASSERT_EQ(top.size(), 4u);  // a list: both "u" entries stay
  EXPECT_EQ(top[2]["token"], "u");
  EXPECT_DOUBLE_EQ(top[2]["logprob"].get<double>(), static_cast<double>(-8.875f));
  ASSERT_TRUE(top[3]["logprob"].is_number());
  EXPECT_EQ(top[3]["logprob"].get<double>(), -9999.0);
}

}  // namespace
}  // namespace hearth::server
