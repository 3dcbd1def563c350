// Turns one request's generated tokens into client-visible events on the engine thread: splits
// the thought (reasoning) from the answer, routes tool-call text away from content, applies stop
// strings with hold-back, bundles logprobs, and decides finish_reason. Not the engine (tokens
// come in) and not JSON (events go out).
#pragma once
#include <memory>

#include "chat/reasoning.h"
#include "generate/stop_strings.h"
#include "server/engine.h"
#include "server/stream_event.h"

namespace hearth::server {

/// Per-request output pipeline: token text -> reasoning splitter (when the engine gives one for
/// this request: the thought goes to kDelta `reasoning`, never through the tool router or the stop
/// strings) -> tool router (when req.tools_active(): text from the engine's
/// tool_call_holdback_start() on is held for parse_tool_calls) -> StopMatcher(req.stop) -> kDelta
/// `text`. Streaming and non-streaming responses are both built from these events, so they agree
/// by construction.
class OutputStream {
 public:
  /// `prompt` is the one prepare() built (it says whether the output starts inside a thought).
  /// `choice`: the choice index (0..req.n-1) stamped on every event this stream pushes.
  OutputStream(const CompletionRequest& req, const Prompt& prompt, const Engine& engine, EventChannel& out,
               int choice = 0);

  /// Handles one generated token; returns false once a stop string matched (stop generating).
  bool on_token(const TokenEvent& ev);

  /// Ends the request: releases held text, parses tool calls, pushes the final delta (if any)
  /// and kDone with finish_reason and counts. finish_reason: "stop" (a stop string matched),
  /// "abort" (f.reason kAborted: cut by shutdown or cancellation), "tool_calls", "length", else
  /// "stop" (EOS).
  void finish(const Finish& f, int64_t prompt_tokens);

 private:
  void emit(std::string reasoning, std::string text);
  std::string pass_stops(std::string_view text);  // stops_.push, remembering the stop that matched

  const CompletionRequest& req_;
  const Engine& engine_;
  EventChannel& out_;
  int choice_;
  bool tools_active_;
  generate::StopMatcher stops_;  // the request's stop strings
  std::string routed_;           // tools active: all content text so far
  size_t sent_ = 0;              // bytes of routed_ passed on (the rest is held for tool parsing)
  std::vector<TokenEvent> pending_logprobs_;
  std::string matched_stop_;     // the stop string that matched ("" = none yet)
  std::unique_ptr<chat::ReasoningSplitter> splitter_;  // null: no reasoning format for this request
  int64_t reasoning_tokens_ = 0;  // tokens that arrived inside a thought, or opened or closed one
};

}  // namespace hearth::server
