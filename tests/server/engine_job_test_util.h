// What the EngineLoop tests with a real ModelEngine share: a greedy text-completion request and the
// collected answer of a submitted Job (its text, finish reason and token counts). Not a test itself.
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "server/engine_loop.h"

namespace hearth::server::testing {

/// A raw-text (no chat template) greedy completion of `prompt`, at most `max_tokens` tokens,
/// through adapter `adapter` when given.
inline CompletionRequest greedy_text_request(const std::string& prompt, int64_t max_tokens,
                                             std::optional<std::string> adapter = {}) {
  CompletionRequest r;
  r.chat = false;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0;
  r.adapter = std::move(adapter);
  return r;
}

/// A finished job's answer: the deltas' text, the finish reason ("error STATUS: MESSAGE" for an
/// error event), completion and cached prompt tokens.
struct JobAnswer {
  std::string text, finish;
  int64_t tokens = 0, cached = 0;
};

/// Waits for `job`'s done or error event (polling every 50 ms) and returns what it streamed.
inline JobAnswer collect_job(Job& job) {
  JobAnswer a;
  for (;;) {
    auto ev = job.events.pop(std::chrono::milliseconds(50));
    if (!ev) continue;
    if (ev->kind == StreamEvent::Kind::kDelta) a.text += ev->text;
    if (ev->kind == StreamEvent::Kind::kDone) {
      a.finish = ev->finish_reason;
      a.tokens = ev->completion_tokens;
      a.cached = ev->cached_tokens;
      return a;
    }
    if (ev->kind == StreamEvent::Kind::kError) {
      a.finish = "error " + std::to_string(ev->status) + ": " + ev->message;
      return a;
    }
  }
}

}  // namespace hearth::server::testing
