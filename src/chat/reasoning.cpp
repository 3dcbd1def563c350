// Reasoning split: format detection from the vocabulary, the primed-prompt check, and the
// incremental splitter (a small state machine over marker strings with partial-marker hold-back).
// Follows the behaviour of vLLM's Qwen3/DeepSeek-R1 reasoning parsers and mlx-bun's
// ThinkingTagSplitter / Gemma channel split; not a tool-call parser.
#include "chat/reasoning.h"

#include <algorithm>

namespace hearth::chat {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string rtrim(std::string s) {
  while (!s.empty() && is_ws(s.back())) s.pop_back();
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return !suffix.empty() && s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Length of the longest suffix of `text` that is a proper prefix of `marker` (0 if none).
size_t partial_len(const std::string& text, const std::string& marker) {
  if (marker.empty()) return 0;
  const size_t max = std::min(text.size(), marker.size() - 1);
  for (size_t n = max; n > 0; --n)
    if (text.compare(text.size() - n, n, marker, 0, n) == 0) return n;
  return 0;
}

// Earliest occurrence in `text` of any of `markers` (non-empty ones): {position, index}, or
// {npos, -1}. Ties go to the longer marker.
std::pair<size_t, int> earliest(const std::string& text, const std::vector<const std::string*>& markers) {
  size_t best = std::string::npos;
  int which = -1;
  for (size_t i = 0; i < markers.size(); ++i) {
    if (markers[i]->empty()) continue;
    size_t p = text.find(*markers[i]);
    if (p == std::string::npos) continue;
    if (p < best || (p == best && markers[i]->size() > markers[static_cast<size_t>(which)]->size())) {
      best = p;
      which = static_cast<int>(i);
    }
  }
  return {best, which};
}

}  // namespace

const ReasoningMarkers& reasoning_markers(ReasoningFormat format) {
  static const ReasoningMarkers none{}, think{"<think>", "</think>", ""}, gemma{"<|channel>", "<channel|>", "thought\n"};
  switch (format) {
    case ReasoningFormat::ThinkTags: return think;
    case ReasoningFormat::Gemma4Channel: return gemma;
    case ReasoningFormat::None: break;
  }
  return none;
}

ReasoningFormat detect_reasoning_format(const std::function<bool(std::string_view)>& has_token) {
  if (has_token("<think>") && has_token("</think>")) return ReasoningFormat::ThinkTags;
  if (has_token("<|channel>") && has_token("<channel|>")) return ReasoningFormat::Gemma4Channel;
  return ReasoningFormat::None;
}

bool prompt_opens_reasoning(const std::string& prompt_text, ReasoningFormat format) {
  if (format == ReasoningFormat::None) return false;
  const ReasoningMarkers& m = reasoning_markers(format);
  const std::string p = rtrim(prompt_text);
  if (ends_with(p, m.open)) return true;
  return !m.name_line.empty() && ends_with(p, m.open + rtrim(m.name_line));
}

ReasoningSplitter::ReasoningSplitter(ReasoningFormat format, bool start_in_reasoning, std::vector<std::string> implicit_ends)
    : format_(format), m_(reasoning_markers(format)), implicit_ends_(std::move(implicit_ends)) {
  implicit_ends_.erase(std::remove(implicit_ends_.begin(), implicit_ends_.end(), std::string()), implicit_ends_.end());
  if (format_ != ReasoningFormat::None && start_in_reasoning) {
    state_ = m_.name_line.empty() ? State::kReasoning : State::kName;
    skip_ws_ = true;
  }
}

void ReasoningSplitter::step(ReasoningSplit& out, bool final) {
  for (;;) {
    if (state_ == State::kContent) {
      if (skip_ws_) {
        size_t b = 0;
        while (b < buf_.size() && is_ws(buf_[b])) ++b;
        buf_.erase(0, b);
        if (buf_.empty()) return;
        skip_ws_ = false;
      }
      auto [p, which] = earliest(buf_, {&m_.open, &m_.close});
      if (p != std::string::npos) {
        out.content.append(buf_, 0, p);
        const std::string& marker = which == 0 ? m_.open : m_.close;
        buf_.erase(0, p + marker.size());
        if (which == 0) state_ = m_.name_line.empty() ? State::kReasoning : State::kName;
        skip_ws_ = which == 0;  // start of a thought (a stray closing marker keeps the text around it)
        continue;
      }
      const size_t hold = final ? 0 : std::max(partial_len(buf_, m_.open), partial_len(buf_, m_.close));
      out.content.append(buf_, 0, buf_.size() - hold);
      buf_.erase(0, buf_.size() - hold);
      return;
    }
    if (state_ == State::kName) {
      if (buf_.compare(0, m_.name_line.size(), m_.name_line) == 0) {
        buf_.erase(0, m_.name_line.size());
        state_ = State::kReasoning;
        continue;
      }
      if (!final && m_.name_line.compare(0, buf_.size(), buf_) == 0) return;  // may still become the name line
      state_ = State::kReasoning;
      continue;
    }
    // kReasoning
    if (skip_ws_) {
      size_t b = 0;
      while (b < buf_.size() && is_ws(buf_[b])) ++b;
      buf_.erase(0, b);
      if (buf_.empty()) return;
      skip_ws_ = false;
    }
    std::vector<const std::string*> ends{&m_.close};
    for (const auto& e : implicit_ends_) ends.push_back(&e);
    auto [p, which] = earliest(buf_, ends);
    if (p != std::string::npos) {
      out.reasoning += rtrim(held_ws_ + buf_.substr(0, p));  // the thought ends: trailing whitespace goes
      held_ws_.clear();
      buf_.erase(0, which == 0 ? p + m_.close.size() : p);  // an implicit end stays in the content
      state_ = State::kContent;
      skip_ws_ = true;
      continue;
    }
    size_t hold = 0;
    if (!final)
      for (const auto* e : ends) hold = std::max(hold, partial_len(buf_, *e));
    std::string s = held_ws_ + buf_.substr(0, buf_.size() - hold);
    buf_.erase(0, buf_.size() - hold);
    size_t last = s.size();
    while (last > 0 && is_ws(s[last - 1])) --last;
    out.reasoning.append(s, 0, last);
    held_ws_ = final ? std::string() : s.substr(last);
    return;
  }
}

ReasoningSplit ReasoningSplitter::push(std::string_view text) {
  ReasoningSplit out;
  if (format_ == ReasoningFormat::None) {
    out.content.assign(text);
    return out;
  }
  buf_.append(text);
  step(out, /*final=*/false);
  return out;
}

ReasoningSplit ReasoningSplitter::flush() {
  ReasoningSplit out;
  if (format_ == ReasoningFormat::None) return out;
  step(out, /*final=*/true);
  buf_.clear();
  held_ws_.clear();
  return out;
}

ReasoningSplit split_reasoning(std::string_view text, ReasoningFormat format, bool start_in_reasoning,
                               const std::vector<std::string>& implicit_ends) {
  ReasoningSplitter s(format, start_in_reasoning, implicit_ends);
  ReasoningSplit a = s.push(text), b = s.flush();
  a.reasoning += b.reasoning;
  a.content += b.content;
  return a;
}

}  // namespace hearth::chat
