// Tests of the reasoning split: format detection from a vocabulary, primed-prompt detection, and
// the splitter on recorded outputs (well-formed and malformed), each also streamed in every
// chunking (one byte at a time, every two-piece cut, random pieces) with the same result.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "chat/reasoning.h"

using hearth::chat::ReasoningFormat;
using hearth::chat::ReasoningSplit;
using hearth::chat::ReasoningSplitter;
using hearth::chat::split_reasoning;

namespace {

struct Case {
  const char* name;
  ReasoningFormat format;
  bool start_in;
  std::vector<std::string> ends;
  std::string text, reasoning, content;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      // Qwen3.5 with thinking on: the template wrote "<think>\n"; the output shows only "</think>".
      {"primed", ReasoningFormat::ThinkTags, true, {},
       "\nThe user asks 2+2.\nThat is 4.\n</think>\n\nThe answer is 4.", "The user asks 2+2.\nThat is 4.", "The answer is 4."},
      {"tags", ReasoningFormat::ThinkTags, false, {}, "<think>\nhmm\n</think>\n\nHi there", "hmm", "Hi there"},
      {"text_before_think", ReasoningFormat::ThinkTags, false, {}, "Sure. <think>why not</think> Done", "why not", "Sure. Done"},
      {"unclosed_primed", ReasoningFormat::ThinkTags, true, {}, "thinking forever and", "thinking forever and", ""},
      {"unclosed_open", ReasoningFormat::ThinkTags, false, {}, "<think>abc\n", "abc", ""},
      {"partial_close_at_end", ReasoningFormat::ThinkTags, true, {}, "abc</thi", "abc</thi", ""},
      {"not_a_marker", ReasoningFormat::ThinkTags, false, {}, "a < b <thinking> c </th", "", "a < b <thinking> c </th"},
      {"stray_close", ReasoningFormat::ThinkTags, false, {}, "Answer</think>\n\nmore", "", "Answer\n\nmore"},
      {"whitespace_inside_kept", ReasoningFormat::ThinkTags, false, {}, "<think>a\n\nb  \n</think>", "a\n\nb", ""},
      {"two_thoughts", ReasoningFormat::ThinkTags, false, {}, "<think>a</think>b<think>c</think>d", "ac", "bd"},
      {"thinking_off_empty", ReasoningFormat::ThinkTags, false, {}, "Just the answer.", "", "Just the answer."},
      // An unclosed thought ends at a tool call (tools on) and the call stays content.
      {"tool_call_ends_thought", ReasoningFormat::ThinkTags, true, {"<tool_call>"},
       "I should call it.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "I should call it.",
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"},
      {"tool_call_inside_thought_without_tools", ReasoningFormat::ThinkTags, true, {}, "x <tool_call>y", "x <tool_call>y", ""},
      {"closed_then_tool_call", ReasoningFormat::ThinkTags, true, {"<tool_call>"}, "plan</think>\n\n<tool_call>{}</tool_call>",
       "plan", "<tool_call>{}</tool_call>"},
      // Gemma 4: special-token markers, the "thought\n" name line removed.
      {"gemma", ReasoningFormat::Gemma4Channel, false, {}, "<|channel>thought\nThe user wants X.<channel|>Answer.",
       "The user wants X.", "Answer."},
      {"gemma_no_name_line", ReasoningFormat::Gemma4Channel, false, {}, "<|channel>Direct<channel|>A", "Direct", "A"},
      {"gemma_name_prefix_at_end", ReasoningFormat::Gemma4Channel, false, {}, "<|channel>thou", "thou", ""},
      {"gemma_empty_thought", ReasoningFormat::Gemma4Channel, false, {}, "<|channel>thought\n<channel|>Hello", "", "Hello"},
      {"gemma_unclosed", ReasoningFormat::Gemma4Channel, false, {}, "Hi<|channel>thought\nstill thinking", "still thinking", "Hi"},
      {"gemma_tool_call_ends_thought", ReasoningFormat::Gemma4Channel, false, {"<|tool_call>"},
       "<|channel>thought\nneed data<|tool_call>call:f{}<tool_call|>", "need data", "<|tool_call>call:f{}<tool_call|>"},
      {"none_passes_through", ReasoningFormat::None, true, {}, "<think>x</think> y", "", "<think>x</think> y"},
  };
  return c;
}

ReasoningSplit stream(const Case& c, const std::vector<size_t>& cuts) {
  ReasoningSplitter s(c.format, c.start_in, c.ends);
  ReasoningSplit all;
  size_t prev = 0;
  for (size_t cut : cuts) {
    ReasoningSplit p = s.push(std::string_view(c.text).substr(prev, cut - prev));
    all.reasoning += p.reasoning;
    all.content += p.content;
    prev = cut;
  }
  ReasoningSplit p = s.push(std::string_view(c.text).substr(prev));
  all.reasoning += p.reasoning;
  all.content += p.content;
  p = s.flush();
  all.reasoning += p.reasoning;
  all.content += p.content;
  return all;
}

}  // namespace

TEST(Reasoning, DetectsTheFormatFromTheVocabulary) {
  std::set<std::string> qwen{"<think>", "</think>", "<|im_end|>"}, gemma{"<|channel>", "<channel|>"},
      llama{"<|eot_id|>"}, half{"<think>"};
  auto in = [](const std::set<std::string>& v) { return [&v](std::string_view t) { return v.count(std::string(t)) > 0; }; };
  EXPECT_EQ(hearth::chat::detect_reasoning_format(in(qwen)), ReasoningFormat::ThinkTags);
  EXPECT_EQ(hearth::chat::detect_reasoning_format(in(gemma)), ReasoningFormat::Gemma4Channel);
  EXPECT_EQ(hearth::chat::detect_reasoning_format(in(llama)), ReasoningFormat::None);
  EXPECT_EQ(hearth::chat::detect_reasoning_format(in(half)), ReasoningFormat::None);
}

TEST(Reasoning, PromptOpensReasoningOnlyWhenItEndsInAnOpenMarker) {
  using hearth::chat::prompt_opens_reasoning;
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n", ReasoningFormat::ThinkTags));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", ReasoningFormat::ThinkTags));
  EXPECT_FALSE(prompt_opens_reasoning("user: what is <think>?\n<|im_start|>assistant\n", ReasoningFormat::ThinkTags));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n", ReasoningFormat::None));
  EXPECT_FALSE(prompt_opens_reasoning("<|turn>model\n", ReasoningFormat::Gemma4Channel));
  EXPECT_TRUE(prompt_opens_reasoning("<|turn>model\n<|channel>", ReasoningFormat::Gemma4Channel));
  EXPECT_TRUE(prompt_opens_reasoning("<|turn>model\n<|channel>thought\n", ReasoningFormat::Gemma4Channel));
}

TEST(Reasoning, RecordedOutputsSplitAsExpected) {
  for (const Case& c : cases()) {
    ReasoningSplit r = split_reasoning(c.text, c.format, c.start_in, c.ends);
    EXPECT_EQ(r.reasoning, c.reasoning) << c.name;
    EXPECT_EQ(r.content, c.content) << c.name;
  }
}

TEST(Reasoning, StreamedEqualsNonStreamedForEveryChunking) {
  std::mt19937 rng(7);
  for (const Case& c : cases()) {
    const size_t n = c.text.size();
    std::vector<size_t> bytes;
    for (size_t i = 1; i < n; ++i) bytes.push_back(i);
    ReasoningSplit r = stream(c, bytes);
    EXPECT_EQ(r.reasoning, c.reasoning) << c.name << " (byte by byte)";
    EXPECT_EQ(r.content, c.content) << c.name << " (byte by byte)";
    for (size_t cut = 0; cut <= n; ++cut) {
      r = stream(c, {cut});
      EXPECT_EQ(r.reasoning, c.reasoning) << c.name << " cut at " << cut;
      EXPECT_EQ(r.content, c.content) << c.name << " cut at " << cut;
    }
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<size_t> cuts;
      for (size_t p = 0; p < n;) {
        p += 1 + rng() % 5;
        if (p < n) cuts.push_back(p);
      }
      r = stream(c, cuts);
      EXPECT_EQ(r.reasoning, c.reasoning) << c.name << " random trial " << trial;
      EXPECT_EQ(r.content, c.content) << c.name << " random trial " << trial;
    }
  }
}

TEST(Reasoning, PartialMarkersAreHeldBackUntilDecided) {
  ReasoningSplitter s(ReasoningFormat::ThinkTags, /*start_in_reasoning=*/true);
  ReasoningSplit p = s.push("Hello </thi");
  EXPECT_EQ(p.reasoning, "Hello");  // the space and "</thi" wait
  EXPECT_EQ(p.content, "");
  EXPECT_TRUE(s.in_reasoning());
  p = s.push("nk>\n\nWorld <");
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "World ");  // "<" may open a new thought
  EXPECT_FALSE(s.in_reasoning());
  p = s.push("b>");
  EXPECT_EQ(p.content, "<b>");
  p = s.flush();
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "");

  ReasoningSplitter g(ReasoningFormat::Gemma4Channel, false);
  p = g.push("<|channel>");
  EXPECT_EQ(p.reasoning, "");
  p = g.push("thoug");  // may still be the name line
  EXPECT_EQ(p.reasoning, "");
  p = g.push("ht\nStep one");
  EXPECT_EQ(p.reasoning, "Step one");
}
