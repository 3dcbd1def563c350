// The interface between a generation request's native events and one API's wire format (OpenAI
// chat/completions, Anthropic Messages, OpenAI Responses): a JSON body, or SSE text per event.
// Not transport: generation_route.h drives a writer from a Job's EventChannel.
#pragma once
#include <string>
#include <vector>

#include "server/stream_event.h"

namespace hearth::server {

/// Formats one response. Streaming calls come in event order on one thread: begin(kStarted),
/// delta(kDelta)*, then end(kDone) or error(kError); a writer may keep state between them
/// (block indexes, sequence numbers). Each returns the bytes to send (possibly "").
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  /// Non-streaming: the JSON body text from every kDelta event and the kDone event.
  virtual std::string full(const std::vector<StreamEvent>& deltas, const StreamEvent& done) = 0;
  /// Non-streaming with n choices: every choice's kDelta events (StreamEvent::choice) and their n
  /// kDone events. Default (APIs without `n`): full(deltas, dones.front()).
  virtual std::string full_choices(const std::vector<StreamEvent>& deltas, const std::vector<StreamEvent>& dones) {
    return full(deltas, dones.front());
  }
  /// Streaming: what is sent once generation started (`started`: kStarted with prompt_tokens).
  virtual std::string begin(const StreamEvent& started) = 0;
  /// Streaming: one kDelta event (text or reasoning).
  virtual std::string delta(const StreamEvent& d) = 0;
  /// Streaming: the closing events for kDone (finish reason, tool calls, usage, terminator); with
  /// n choices called once per choice, the terminator after the last.
  virtual std::string end(const StreamEvent& done) = 0;
  /// Streaming: an error after the stream started (kError); the stream ends after it.
  virtual std::string error(const StreamEvent& e) = 0;
};

}  // namespace hearth::server
