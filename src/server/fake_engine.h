// A deterministic stand-in Engine for server tests and `hearth serve --fake-engine`: no model,
// no tokenizer. It echoes the last user message word by word, or emits scripted text. Not for
// measuring anything about models; only the server around it.
#pragma once
#include <atomic>
#include <mutex>

#include "chat/reasoning.h"
#include "server/engine.h"

namespace hearth::server {

struct FakeEngineOptions {
  std::string model_id = "fake-model";
  int64_t context_length = 4096;
  int token_delay_ms = 0;  ///< sleep before each token (to test disconnects and a full queue)
  /// Reasoning convention of the pretend model (chat requests): its output is split into
  /// reasoning_content and content; chat_template_kwargs.enable_thinking == true stands for a
  /// template that primed the open marker (Prompt::reasoning_open).
  chat::ReasoningFormat reasoning = chat::ReasoningFormat::None;
  int64_t max_token_bytes = 0;  ///< Engine::max_token_bytes (0 = no early size check)
};

/// Behaviour, by the last message (chat) or the prompt (completions):
/// - starts with "emit:" → emits the rest verbatim, 3 UTF-8 characters per token;
/// - role "tool" → emits "Tool result: <content>";
/// - otherwise → echoes its words, one token per word ("a", " b", " c").
/// Prompt tokens = whitespace-separated words of the rendered prompt ("<role>: <content>" lines).
/// Natural end counts one extra (EOS) token in completion_tokens, like a real model.
/// prepare() throws InvalidArgument for an adapter other than "none", or a prompt containing
/// "__bad_prompt__", and sleeps 1.5 s for a prompt containing "__slow_prepare__"; generate() throws after one token for a prompt containing
/// "__fail_generate__" (an internal failure: 500 / mid-stream error event). Logprobs are synthetic: token i gets -0.5 * (i % 4 + 1), alternatives
/// "alt1".."altK" lower. Observable counters let tests see cancellation.
class FakeEngine : public Engine {
 public:
  explicit FakeEngine(FakeEngineOptions opts = {});

  std::string model_id() const override { return opts_.model_id; }
  int64_t context_length() const override { return opts_.context_length; }
  int64_t max_token_bytes() const override { return opts_.max_token_bytes; }
  Prompt prepare(const CompletionRequest& req) override;
  Finish generate(const Prompt& prompt, const CompletionRequest& req, const TokenCallback& on_token) override;
  /// opts.reasoning's splitter for chat requests (Hermes "<tool_call>" ends a thought when tools
  /// are active), else nullptr.
  std::unique_ptr<chat::ReasoningSplitter> reasoning_splitter(const CompletionRequest& req,
                                                              const Prompt& prompt) const override;

  void set_token_delay_ms(int ms) { delay_ms_ = ms; }
  int generations() const { return generations_; }        ///< generate() calls started
  int prepares() const { return prepares_; }              ///< prepare() calls started
  int stopped_early() const { return stopped_early_; }    ///< generations ended by on_token == false
  int64_t tokens_emitted() const { return tokens_; }      ///< on_token calls, all generations
  bool busy() const { return busy_; }                     ///< inside generate() now
  CompletionRequest last_request() const;                 ///< the last request generate() saw

  /// The pieces this engine would emit for `req` (before max_tokens), for test expectations.
  static std::vector<std::string> script(const CompletionRequest& req);

 private:
  FakeEngineOptions opts_;
  std::atomic<int> delay_ms_;
  std::atomic<int> generations_{0};
  std::atomic<int> prepares_{0};
  std::atomic<int> stopped_early_{0};
  std::atomic<int64_t> tokens_{0};
  std::atomic<bool> busy_{false};
  mutable std::mutex mu_;
  CompletionRequest last_;
};

}  // namespace hearth::server
