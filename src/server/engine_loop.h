// The engine thread: the one thread that touches the Engine, fed by a bounded FIFO of Jobs.
// Not the HTTP layer: handlers submit Jobs and read their EventChannels (server.h).
#pragma once
#include <condition_variable>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <semaphore>
#include <thread>

#include "server/engine.h"
#include "server/stream_event.h"

namespace hearth::server {

struct EngineLoopOptions {
  size_t max_queue = 64;  ///< jobs waiting (not counting the running one); more -> 429
  /// Generated-token limit when a request sets none: 0 = up to the context length.
  int64_t default_max_tokens_chat = 0;
  int64_t default_max_tokens_completion = 512;  ///< /v1/completions default (as mlx-lm)
  /// Prompts built (templated + tokenized) at once on submitting threads; more wait their turn.
  /// 0 = the number of cores, at most 8.
  size_t max_concurrent_prepares = 0;
  /// Requests generated together when the engine batches (Engine::supports_batching; vLLM's
  /// --max-num-seqs). 1 = one at a time.
  size_t max_num_seqs = 32;  ///< a request with n choices takes n of them (n above it: 400 "n")
  /// Bytes of cache state the running generations may hold together (`--memory-budget`; 0 = no
  /// limit). Each request reserves Engine::state_bytes(prompt + max_tokens) while it runs (per
  /// choice; max_tokens after the default above, so a chat request without one reserves the whole
  /// context when the default fills it): one that can never fit is refused (400, param
  /// "max_tokens", code "memory_budget_exceeded", the message spelling out the charge:
  /// Engine::state_charge's terms, and that max_tokens was defaulted when it was), one that does
  /// not fit now waits in the queue for running ones to finish.
  int64_t memory_budget = 0;
};

/// Runs Jobs on its own thread: tasks, or generations through an OutputStream (kStarted,
/// kDelta..., kDone). With an engine that batches, up to opts.max_num_seqs generations run together
/// (continuous batching: each iteration admits queued requests into free slots, runs one
/// Engine::step over all running ones, and frees a finished or cancelled one at once); a task
/// (adapter mount/unmount) waits until no generation runs and runs alone. Otherwise one generate()
/// at a time. The prompt is built before that, by submit() on the submitting
/// (HTTP) thread, so that a huge prompt never stalls other requests: first a cheap size check
/// (the request's text bytes against context_length() * Engine::max_token_bytes(): more cannot
/// fit, whatever the tokenizer does), then Engine::prepare() (errors -> kError 400/500), then the
/// limits: a prompt that leaves no room for one token -> 400 code "context_length_exceeded" with
/// param "messages" (chat) or "prompt" (as OpenAI and vLLM); a client max_tokens above
/// context - prompt -> 400 with param "max_tokens" (never clamped); no max_tokens -> the default
/// above, clamped to the room left. On the engine thread, Engine::check_request() runs again
/// just before generate() (an adapter may have been unmounted meanwhile; 400). A job whose
/// `cancelled` flag is set is skipped, or stopped at its next token or prompt chunk (submit() points
/// CompletionRequest::cancelled at it, which the engine polls) and finished with finish_reason
/// "abort" (the partial answer is delivered; a cut answer never claims "stop"), freeing its slot and
/// its reserved budget at once.
/// kError events carry the ApiError's status, param and code.
/// Bytes of request text any prompt built from `req` contains (message contents, names, ids,
/// thoughts, tool calls, tools, template kwargs; the prompt of a completion): more than
/// context_length() * max_token_bytes() cannot fit whatever the tokenizer does.
uint64_t request_text_bytes(const CompletionRequest& req);

class EngineLoop {
 public:
  EngineLoop(Engine& engine, EngineLoopOptions opts);
  ~EngineLoop();  ///< shutdown()
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  /// Builds the request's prompt on the calling thread (see above) and queues it; returns nullptr
  /// when the queue is full or the loop is shutting down. When the prompt cannot be built or
  /// does not fit, the job is returned unqueued with its kError event already pushed.
  std::shared_ptr<Job> submit(CompletionRequest req);
  /// Queues `task` to run on the engine thread in FIFO order with the requests (for adapter
  /// mount/unmount, which must not race a forward). Its job ends with kDone, or kError carrying
  /// the ApiError's status (hearth::Error → 400, anything else → 500). nullptr as submit().
  std::shared_ptr<Job> submit_task(std::function<void()> task);

  /// Cancels the running job (it ends at its next token with finish_reason "abort", like vLLM's
  /// aborted requests), fails queued ones with 503, and joins the thread. Idempotent.
  void shutdown();

  /// Jobs waiting to run (excluding the running ones).
  size_t queued() const;
  /// Generations running now (0 or 1 without batching).
  size_t running() const;
  /// Cache bytes the running generations reserved (see EngineLoopOptions::memory_budget).
  int64_t reserved_bytes() const;
  /// EngineLoopOptions::memory_budget (0 = none).
  int64_t memory_budget() const { return opts_.memory_budget; }

 private:
  struct Slot;
  void run();
  void run_batched();
  void run_job(Job& job);
  // Checks and starts a job's n choices as n slots appended to `slots` (each reserving
  // `reserved_each` bytes); false (error pushed, reservation released) when it cannot run.
  bool admit(std::list<Slot>& slots, const std::shared_ptr<Job>& job, int64_t reserved_each);
  void step_all(std::list<Slot>& slots);  // one Engine::step, then finish what is done
  void release(int64_t bytes);            // gives reserved budget back
  bool prepare(Job& job);  // fills job.prompt, or pushes the kError event and returns false
  std::shared_ptr<Job> enqueue(std::shared_ptr<Job> job);

  Engine& engine_;
  EngineLoopOptions opts_;
  mutable std::mutex mu_;
  std::mutex join_mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::shared_ptr<Job> running_;                 // the running job (one-at-a-time path)
  std::vector<std::shared_ptr<Job>> batch_;      // the running generations (batched path)
  int64_t reserved_ = 0;                         // state bytes the running generations reserved
  bool stopping_ = false;
  std::counting_semaphore<> prepare_slots_;
  std::thread thread_;
};

}  // namespace hearth::server
