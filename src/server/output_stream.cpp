// OutputStream: reasoning splitter + tool router + stop strings + logprob bundling for one request.
// Not thread-safe: lives on the engine thread for the duration of one generate() call.
#include "server/output_stream.h"

#include <algorithm>

namespace hearth::server {

OutputStream::OutputStream(const CompletionRequest& req, const Prompt& prompt, const Engine& engine, EventChannel& out,
                           int choice)
    : req_(req),
      engine_(engine),
      out_(out),
      choice_(choice),
      tools_active_(req.chat && req.tools_active()),
      stops_(req.stop),
      splitter_(engine.reasoning_splitter(req, prompt)) {}

void OutputStream::emit(std::string reasoning, std::string text) {
  if (!reasoning.empty()) {
    StreamEvent ev;
    ev.kind = StreamEvent::Kind::kDelta;
    ev.choice = choice_;
    ev.reasoning = std::move(reasoning);
    ev.logprobs.swap(pending_logprobs_);
    out_.push(std::move(ev));
  }
  if (text.empty() && pending_logprobs_.empty()) return;
  StreamEvent ev;
  ev.kind = StreamEvent::Kind::kDelta;
  ev.choice = choice_;
  ev.text = std::move(text);
  ev.logprobs.swap(pending_logprobs_);
  out_.push(std::move(ev));
}

std::string OutputStream::pass_stops(std::string_view text) {
  auto s = stops_.push(text);
  if (s.stopped) matched_stop_ = stops_.stops()[s.stop_index];
  return std::move(s.text);
}

bool OutputStream::on_token(const TokenEvent& ev) {
  if (req_.logprobs && !ev.text_only) {
    TokenEvent lp;
    lp.id = ev.id;
    lp.token = ev.token;
    lp.bytes = ev.bytes;
    lp.logprob = ev.logprob;
    lp.top_logprobs = ev.top_logprobs;
    pending_logprobs_.push_back(std::move(lp));
  }
  std::string text = ev.text, reasoning;
  if (splitter_) {
    const bool was_in = splitter_->in_reasoning();
    chat::ReasoningSplit s = splitter_->push(ev.text);
    if (!ev.text_only && (was_in || splitter_->in_reasoning())) ++reasoning_tokens_;
    reasoning = std::move(s.reasoning);
    text = std::move(s.content);
  }
  std::string content;
  if (tools_active_) {
    routed_ += text;
    const size_t hold = std::max(sent_, std::min(engine_.tool_call_holdback_start(routed_), routed_.size()));
    content = routed_.substr(sent_, hold - sent_);
    sent_ = hold;
  } else {
    content = std::move(text);
  }
  std::string released = pass_stops(content);
  emit(std::move(reasoning), std::move(released));
  return !stops_.stopped();
}

void OutputStream::finish(const Finish& f, int64_t prompt_tokens) {
  StreamEvent done;
  done.kind = StreamEvent::Kind::kDone;
  done.choice = choice_;
  std::string reasoning, tail;
  if (splitter_ && !stops_.stopped()) {
    chat::ReasoningSplit s = splitter_->flush();
    reasoning = std::move(s.reasoning);
    if (tools_active_) routed_ += s.content;
    else tail = pass_stops(s.content);
  }
  const std::string held = tools_active_ ? routed_.substr(sent_) : std::string();
  if (!stops_.stopped() && !held.empty()) {
    ParsedToolCalls parsed = engine_.parse_tool_calls(held, req_.tools);
    if (parsed.calls.empty()) {
      tail += pass_stops(held);  // nothing parsed: the held text is ordinary content
    } else {
      done.tool_calls = std::move(parsed.calls);
      if (!stops_.stopped()) tail += stops_.flush();
      tail += parsed.content;  // text around the calls stays visible
    }
  }
  if (!stops_.stopped()) tail += stops_.flush();
  emit(std::move(reasoning), std::move(tail));
  done.stop_sequence = matched_stop_;
  if (stops_.stopped()) done.finish_reason = "stop";
  else if (f.reason == Finish::Reason::kAborted) done.finish_reason = "abort";  // cut: never "stop"
  else if (!done.tool_calls.empty()) done.finish_reason = "tool_calls";
  else if (f.reason == Finish::Reason::kLength) done.finish_reason = "length";
  else done.finish_reason = "stop";
  done.prompt_tokens = prompt_tokens;
  done.completion_tokens = f.completion_tokens;
  done.cached_tokens = f.cached_tokens;
  done.reasoning_tokens = std::min(reasoning_tokens_, f.completion_tokens);
  out_.push(std::move(done));
}

}  // namespace hearth::server
