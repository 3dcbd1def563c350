// OutputStream: tool router + stop strings + logprob bundling for one request.
// Not thread-safe: lives on the engine thread for the duration of one generate() call.
#include "server/output_stream.h"

namespace hearth::server {

OutputStream::OutputStream(const CompletionRequest& req, const Engine& engine, EventChannel& out)
    : req_(req),
      engine_(engine),
      out_(out),
      tools_active_(req.chat && req.tools_active()),
      tool_open_(std::vector<std::string>{tools_active_ ? engine.tool_call_open_tag() : std::string()}),
      stops_(req.stop) {}

void OutputStream::emit(std::string text) {
  if (text.empty() && pending_logprobs_.empty()) return;
  StreamEvent ev;
  ev.kind = StreamEvent::Kind::kDelta;
  ev.text = std::move(text);
  ev.logprobs.swap(pending_logprobs_);
  out_.push(std::move(ev));
}

bool OutputStream::on_token(const TokenEvent& ev) {
  if (req_.logprobs) {
    TokenEvent lp;
    lp.id = ev.id;
    lp.token = ev.token;
    lp.logprob = ev.logprob;
    lp.top_logprobs = ev.top_logprobs;
    pending_logprobs_.push_back(std::move(lp));
  }
  std::string content;
  if (in_tool_) {
    tool_text_ += ev.text;
  } else if (tools_active_) {
    auto r = tool_open_.push(ev.text);
    content = std::move(r.text);
    if (r.stopped) {
      in_tool_ = true;
      tool_text_ = engine_.tool_call_open_tag() + r.rest;
    }
  } else {
    content = ev.text;
  }
  auto s = stops_.push(content);
  emit(std::move(s.text));
  return !s.stopped;
}

void OutputStream::finish(const Finish& f, int64_t prompt_tokens) {
  std::string tail;
  if (!stops_.stopped()) {
    if (tools_active_ && !in_tool_) tail = stops_.push(tool_open_.flush()).text;
    if (!stops_.stopped()) tail += stops_.flush();
  }
  StreamEvent done;
  done.kind = StreamEvent::Kind::kDone;
  if (in_tool_) {
    ParsedToolCalls parsed = engine_.parse_tool_calls(tool_text_);
    done.tool_calls = std::move(parsed.calls);
    // Text around the calls (or the whole block when nothing parsed) stays visible as content.
    if (done.tool_calls.empty()) tail += tool_text_;
    else if (!parsed.content.empty()) tail += parsed.content;
  }
  emit(std::move(tail));
  if (!done.tool_calls.empty()) done.finish_reason = "tool_calls";
  else if (stops_.stopped()) done.finish_reason = "stop";
  else if (f.reason == Finish::Reason::kLength) done.finish_reason = "length";
  else done.finish_reason = "stop";
  done.prompt_tokens = prompt_tokens;
  done.completion_tokens = f.completion_tokens;
  out_.push(std::move(done));
}

}  // namespace hearth::server
