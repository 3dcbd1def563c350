// Reasoning ("thinking") in generated text: which marker convention a model uses (Qwen3-style
// <think>…</think> tags, Gemma 4's <|channel>thought\n…<channel|>), and a streaming splitter that
// separates the thought from the answer, holding back partial markers so that streamed and
// non-streamed output split the same way. Not the prompt side (the chat template renders
// enable_thinking) and not tool calls (chat/tool_calls.h parses the answer part).
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace hearth::chat {

enum class ReasoningFormat {
  None,           // no reasoning convention: all output is the answer
  ThinkTags,      // <think>reasoning</think>answer   (Qwen3, Qwen3.5, MiniCPM, DeepSeek-R1 distills)
  Gemma4Channel,  // <|channel>thought\nreasoning<channel|>answer   (Gemma 4; both markers are special tokens)
};

/// The marker strings of a format: `open` and `close` delimit a thought; `name_line` is a line
/// that may follow `open` and is not part of the thought ("thought\n" for Gemma 4, "" otherwise).
/// All empty for None.
struct ReasoningMarkers {
  std::string open, close, name_line;
};
const ReasoningMarkers& reasoning_markers(ReasoningFormat format);

/// Picks the format from the tokenizer vocabulary: `has_token(s)` says whether `s` is one token
/// (an added or model token). Both "<think>" and "</think>" → ThinkTags; else both "<|channel>"
/// and "<channel|>" → Gemma4Channel; else None. Follows mlx-bun's detection (reference inventory
/// §4.5), keyed on the vocabulary rather than the template text.
ReasoningFormat detect_reasoning_format(const std::function<bool(std::string_view)>& has_token);

/// Whether a rendered prompt leaves the model inside an open thought: after trimming trailing
/// whitespace, the prompt ends with the open marker (Qwen3.5 with thinking on ends
/// "<|im_start|>assistant\n<think>\n"), or, for Gemma 4, with the open marker and its name line.
/// Then the output starts as reasoning and may show only the closing marker.
bool prompt_opens_reasoning(const std::string& prompt_text, ReasoningFormat format);

/// A piece of generated text split in two. Concatenating the `reasoning` (resp. `content`) parts
/// of every push() and the flush() gives the whole thought (resp. answer).
struct ReasoningSplit {
  std::string reasoning;
  std::string content;
};

/// Incremental splitter for one generation. Rules (the same for any chunking of the text):
/// - Outside a thought, text is content; `open` starts a thought (the marker is dropped). A stray
///   `close` outside a thought is dropped (a control marker, never shown).
/// - Inside a thought, text is reasoning up to `close` (dropped), after which text is content
///   again; several thoughts are allowed. The name line right after `open` is removed; whitespace
///   at the start and end of a thought, and at the start of the content that follows it, is
///   removed.
/// - A thought with no `close` runs to the end of the output (all reasoning), except that one of
///   `implicit_ends` (e.g. the tool-call opening tag while tools are on) ends it too and, unlike
///   `close`, stays in the content, so an unclosed thought never swallows a tool call.
/// - A suffix that may be the start of a marker is held back until the next push() or flush().
/// Never throws on model output. Not thread-safe (one per stream).
class ReasoningSplitter {
 public:
  /// `start_in_reasoning`: the prompt opened the thought (prompt_opens_reasoning). With
  /// ReasoningFormat::None everything passes through as content.
  ReasoningSplitter(ReasoningFormat format, bool start_in_reasoning, std::vector<std::string> implicit_ends = {});

  /// Adds newly generated text; returns what is now certain.
  ReasoningSplit push(std::string_view text);
  /// End of output: releases held text (a partial marker is ordinary text of its side).
  ReasoningSplit flush();
  /// True while inside a thought.
  bool in_reasoning() const { return state_ != State::kContent; }

 private:
  enum class State { kContent, kName, kReasoning };
  void step(ReasoningSplit& out, bool final);

  ReasoningFormat format_;
  ReasoningMarkers m_;
  std::vector<std::string> implicit_ends_;
  State state_ = State::kContent;
  std::string buf_;              // text not yet classified
  bool skip_ws_ = false;         // drop leading whitespace (start of a thought / after one)
  std::string held_ws_;          // reasoning: trailing whitespace, emitted only if more text follows
};

/// Non-streamed split of a whole output: push(text) then flush() on a fresh splitter.
ReasoningSplit split_reasoning(std::string_view text, ReasoningFormat format, bool start_in_reasoning,
                               const std::vector<std::string>& implicit_ends = {});

}  // namespace hearth::chat
