// What flows from the engine thread to an HTTP handler for one request: native events (started,
// text delta, done, error) through a small blocking queue. Not JSON: routes format events.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/engine.h"

namespace hearth::server {

/// One event of a request's output, in order: kStarted, kDelta*, then kDone or kError (an
/// error can also come first, e.g. a prompt longer than the context). With n > 1 choices the
/// deltas of the choices interleave and each choice ends with its own kDone (n in all).
struct StreamEvent {
  enum class Kind { kStarted, kDelta, kDone, kError };
  Kind kind = Kind::kDelta;
  int64_t prompt_tokens = 0;         ///< kStarted, kDone
  int choice = 0;                    ///< kDelta, kDone: the choice (OpenAI `index`, 0..n-1) it belongs to
  std::string text;                  ///< kDelta: client-visible text (after stop/tool hold-back)
  std::string reasoning;             ///< kDelta: thought text (reasoning_content); a delta has text or reasoning
  std::vector<TokenEvent> logprobs;  ///< kDelta: tokens accounted for since the last delta
  std::vector<ToolCall> tool_calls;  ///< kDone
  std::string finish_reason;         ///< kDone: "stop" | "length" | "tool_calls" | "abort"
  std::string stop_sequence;         ///< kDone: the request's stop string that ended the output ("" = none)
  int64_t completion_tokens = 0;     ///< kDone
  int64_t cached_tokens = 0;         ///< kDone: prompt tokens served from the prompt cache
  /// kDone: of completion_tokens, those generated inside a thought (its markers included)
  int64_t reasoning_tokens = 0;
  int status = 0;                    ///< kError: HTTP status
  std::string message;               ///< kError
  std::string param;                 ///< kError: OpenAI `param` ("" = null)
  std::string code;                  ///< kError: OpenAI `code` ("" = null)
};

/// A single-producer single-consumer queue of StreamEvents.
class EventChannel {
 public:
  void push(StreamEvent ev) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(ev));
    }
    cv_.notify_one();
  }
  /// The next event, or nullopt after `timeout` without one.
  std::optional<StreamEvent> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !q_.empty(); })) return std::nullopt;
    StreamEvent ev = std::move(q_.front());
    q_.pop_front();
    return ev;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> q_;
};

/// A request in flight: the parsed request, its output channel, and a cancel flag the HTTP side
/// sets when a streaming client disconnects and EngineLoop::shutdown sets on the running job (the
/// engine checks it per token and between prompt chunks, through CompletionRequest::cancelled; a
/// generation cut this way ends with finish_reason "abort"). A job with a `task` is an
/// engine-thread chore instead (adapter mount/unmount): it runs in queue order, between
/// generations, and reports kDone or kError.
struct Job {
  std::function<void()> task;
  CompletionRequest request;
  Prompt prompt;  ///< built by EngineLoop::submit on the submitting thread
  EventChannel events;
  std::atomic<bool> cancelled{false};
};

}  // namespace hearth::server
