// Native stream events -> OpenAI response JSON: chat.completion / chat.completion.chunk and
// text_completion objects, logprobs blocks, usage, and SSE framing. Not request parsing
// (request_parse.h) and not transport (server.h).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "server/response_writer.h"
#include "server/stream_event.h"

namespace hearth::server {

using ojson = nlohmann::ordered_json;

/// What every object of one response shares.
struct ResponseMeta {
  std::string id;       ///< "chatcmpl-<hex>" or "cmpl-<hex>"
  int64_t created = 0;  ///< unix seconds
  std::string model;    ///< the served model id
  bool chat = true;
  bool include_usage = false;  ///< streaming: "usage": null on chunks + a final usage chunk
  bool logprobs = false;
  int n = 1;  ///< choices (OpenAI `n`): the stream ends after the n-th choice's closing chunks
};

/// A fresh response id: "chatcmpl-" (chat) or "cmpl-" + 24 random hex digits.
std::string new_response_id(bool chat);

/// JSON text of `j`; invalid UTF-8 in model text is replaced (U+FFFD), never thrown on.
std::string dump_json(const ojson& j);

/// One SSE event: "data: <json>\n\n".
std::string sse(const ojson& j);

/// Streaming: the first chunk of choice `choice` (chat: delta {role: "assistant", content: ""});
/// completions have no first chunk (returns null).
ojson first_chunk(const ResponseMeta& m, int choice = 0);
/// Streaming: the chunk for one kDelta event: delta {"content"} or, for thought text,
/// {"reasoning_content"} (vLLM's reasoning parsers, DeepSeek's API), and logprobs when asked.
/// Completions' logprobs.text_offset: each token's character offset in the choice's whole text,
/// counted from `*text_offset` (the characters of the choice's earlier tokens; null = 0), which is
/// advanced past this chunk's tokens, so a stream reports what the non-streamed answer does.
ojson delta_chunk(const ResponseMeta& m, const StreamEvent& delta, int64_t* text_offset = nullptr);
/// Streaming: the closing chunks of choice done.choice for its kDone: tool_calls delta (if any)
/// and the finish_reason chunk. The usage chunk and "data: [DONE]" are added by the caller.
std::vector<ojson> final_chunks(const ResponseMeta& m, const StreamEvent& done);
/// Streaming, include_usage: the usage chunk (choices: []).
ojson usage_chunk(const ResponseMeta& m, int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);

/// Non-streaming: the whole response from all kDelta events and the kDone event of each choice
/// (choices ordered by index, each from its own deltas); a message has "reasoning_content" (the
/// concatenated thought) only when the model produced one. usage: the prompt once, the completion
/// tokens summed over the choices. Completions' logprobs.text_offset: the character (code point)
/// offset of each token in its choice's text, as OpenAI and vLLM count it (a character split over
/// two tokens counts at the token where it begins).
ojson full_response(const ResponseMeta& m, const std::vector<StreamEvent>& deltas, const std::vector<StreamEvent>& dones);

/// usage {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details: {cached_tokens}}
/// (OpenAI's shape; cached_tokens: prompt tokens reused from the prompt cache).
ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens = 0);

/// The ResponseWriter of /v1/chat/completions and /v1/completions: the functions above, with
/// "data: [DONE]" after the closing chunks and an OpenAI error body as a mid-stream error event.
class OpenAiWriter : public ResponseWriter {
 public:
  explicit OpenAiWriter(ResponseMeta m) : m_(std::move(m)) {}
  std::string full(const std::vector<StreamEvent>& deltas, const StreamEvent& done) override;
  std::string full_choices(const std::vector<StreamEvent>& deltas, const std::vector<StreamEvent>& dones) override;
  /// The first chunk of every choice.
  std::string begin(const StreamEvent& started) override;
  /// A chunk; completions' text_offset continues from the choice's earlier chunks.
  std::string delta(const StreamEvent& d) override;
  /// One choice's closing chunks; after the last of m.n choices also the usage chunk (prompt once,
  /// completions summed) and "data: [DONE]".
  std::string end(const StreamEvent& done) override;
  std::string error(const StreamEvent& e) override;

 private:
  ResponseMeta m_;
  int ended_ = 0;  // choices closed so far
  std::vector<int64_t> text_offsets_;  // per choice: characters of the tokens streamed so far
  int64_t completion_tokens_ = 0, cached_tokens_ = 0;
};

}  // namespace hearth::server
