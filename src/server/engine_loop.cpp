// EngineLoop: bounded FIFO + one worker thread that owns every call into the Engine, and the
// continuous-batching scheduler (admit into free slots, step all, free finished) over it.
// Not the batched forward itself (generate/batch.h) and not HTTP.
#include "server/engine_loop.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <list>
#include <optional>

#include "core/error.h"
#include "server/api_error.h"
#include "server/output_stream.h"

namespace hearth::server {
namespace {
StreamEvent error_event(int status, std::string message, std::string param = {}, std::string code = {}) {
  StreamEvent ev;
  ev.kind = StreamEvent::Kind::kError;
  ev.status = status;
  ev.message = std::move(message);
  ev.param = std::move(param);
  ev.code = std::move(code);
  return ev;
}

size_t prepare_slots(size_t asked) {
  if (asked > 0) return asked;
  return std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
}

// Holds one of the prepare slots for a scope.
class SlotGuard {
 public:
  explicit SlotGuard(std::counting_semaphore<>& s) : s_(s) { s_.acquire(); }
  ~SlotGuard() { s_.release(); }
  SlotGuard(const SlotGuard&) = delete;
  SlotGuard& operator=(const SlotGuard&) = delete;

 private:
  std::counting_semaphore<>& s_;
};

// " (F fixed + P bytes per token x T tokens: prompt + max_tokens = N rounded up to the caches'
// R-token growth step [+ S bytes per token x M tokens of the sliding-window layers, ...])", or ""
// when the engine does not say how it charges.
std::string charge_explained(const Engine::StateCharge& c, int64_t tokens) {
  if (c.per_token <= 0 && c.fixed <= 0 && c.window_per_token <= 0) return "";
  const int64_t r = std::max<int64_t>(c.round_to, 1);
  auto round = [&](int64_t n) { return (std::max<int64_t>(n, 1) + r - 1) / r * r; };
  std::string windows;
  if (c.window_per_token > 0)
    windows = cat(" + ", c.window_per_token, " bytes per token x ", round(std::min(tokens, c.window_tokens)),
                  " tokens of the sliding-window layers (at most ", c.window_tokens, " tokens: their window - 1 + one prefill chunk)");
  return cat(" (", c.fixed > 0 ? cat(c.fixed, " fixed bytes + ") : std::string(), c.per_token, " bytes per token x ", round(tokens),
             " tokens: prompt + max_tokens = ", tokens, r > 1 ? cat(" rounded up to the caches' ", r, "-token growth step") : std::string(),
             windows, ")");
}

}  // namespace

uint64_t request_text_bytes(const CompletionRequest& req) {
  if (!req.chat) return req.prompt.size();  // token ids need no tokenizing: their count is checked exactly
  uint64_t n = 0;
  for (const auto& m : req.messages) {
    n += m.content ? m.content->size() : 0;
    n += m.name.size() + m.tool_call_id.size() + (m.reasoning_content ? m.reasoning_content->size() : 0);
    for (const auto& tc : m.tool_calls) n += tc.name.size() + tc.arguments_json.size();
  }
  if (!req.tools.empty()) n += req.tools.dump().size();
  if (!req.chat_template_kwargs.empty()) n += req.chat_template_kwargs.dump().size();
  return n;
}

EngineLoop::EngineLoop(Engine& engine, EngineLoopOptions opts)
    : engine_(engine), opts_(opts), prepare_slots_(static_cast<std::ptrdiff_t>(prepare_slots(opts.max_concurrent_prepares))) {
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() { shutdown(); }

std::shared_ptr<Job> EngineLoop::submit(CompletionRequest req) {
  {
    std::lock_guard<std::mutex> lock(mu_);  // refuse before building a prompt for nothing
    if (stopping_ || queue_.size() >= opts_.max_queue) return nullptr;
  }
  auto job = std::make_shared<Job>();
  job->request = std::move(req);
  job->request.cancelled = &job->cancelled;  // the engine polls it between prompt chunks
  if (!prepare(*job)) return job;
  return enqueue(std::move(job));
}

bool EngineLoop::prepare(Job& job) {
  CompletionRequest& req = job.request;
  const int64_t ctx = engine_.context_length();
  const char* what = req.chat ? "messages" : "prompt";
  if (const int64_t per_token = engine_.max_token_bytes(); per_token > 0) {
    const uint64_t bytes = request_text_bytes(req);
    const uint64_t most = static_cast<uint64_t>(ctx) * static_cast<uint64_t>(per_token);
    if (bytes > most) {
      job.events.push(error_event(400, cat("This model's maximum context length is ", ctx, " tokens. However, your ", what,
                                           req.chat ? " (with tools and chat_template_kwargs) hold " : " holds ", bytes, " bytes of text, more than ", ctx, " tokens can cover (one token is at most ",
                                           per_token, " bytes). Please reduce the length of the ", what, "."),
                                  what, "context_length_exceeded"));
      return false;
    }
  }
  if (req.n < 1 || static_cast<size_t>(req.n) > opts_.max_num_seqs) {
    // The n choices run together as n sequences of the batch: more than the batch holds never run.
    job.events.push(error_event(400, cat("Invalid 'n': ", req.n, " choices were asked, but this server generates at most ",
                                         opts_.max_num_seqs, " sequences at once (--max-num-seqs)."),
                                "n", "invalid_value"));
    return false;
  }
  try {
    SlotGuard slot(prepare_slots_);
    job.prompt = engine_.prepare(req);
  } catch (const ApiError& e) {
    job.events.push(error_event(e.status(), e.what(), e.param(), e.code()));
    return false;
  } catch (const Error& e) {
    job.events.push(error_event(400, e.what()));
    return false;
  } catch (const c10::Error& e) {
    job.events.push(error_event(500, std::string("Internal error while building the prompt: ") + e.what_without_backtrace()));
    return false;
  } catch (const std::exception& e) {
    job.events.push(error_event(500, std::string("Internal error while building the prompt: ") + e.what()));
    return false;
  }
  const int64_t n_prompt = static_cast<int64_t>(job.prompt.ids.size());
  if (n_prompt >= ctx) {
    // OpenAI / vLLM: 400 context_length_exceeded, naming the input.
    job.events.push(error_event(400, cat("This model's maximum context length is ", ctx, " tokens. However, your ", what,
                                         " resulted in ", n_prompt, " tokens (the prompt plus at least one generated token must fit). "
                                         "Please reduce the length of the ", what, "."),
                                what, "context_length_exceeded"));
    return false;
  }
  const int64_t room = ctx - n_prompt;
  if (req.max_tokens && *req.max_tokens > room) {
    // OpenAI / vLLM: a client limit that cannot fit is refused, not silently lowered; the error
    // names the field the client sent (max_tokens, max_completion_tokens, max_output_tokens).
    job.events.push(error_event(400, cat(req.max_tokens_param, " is too large: ", *req.max_tokens,
                                         ". This model's context length is ", ctx, " tokens and the prompt has ",
                                         n_prompt, " tokens, so at most ", room, " tokens can be generated (", *req.max_tokens,
                                         " > ", ctx, " - ", n_prompt, ")."),
                                req.max_tokens_param, "context_length_exceeded"));
    return false;
  }
  const bool defaulted = !req.max_tokens;
  if (!req.max_tokens) {
    // The server's default (chat: --max-tokens, completions: 512) is only a cap: clamp it to the
    // room left; 0 fills the context.
    int64_t limit = req.chat ? opts_.default_max_tokens_chat : opts_.default_max_tokens_completion;
    req.max_tokens = limit <= 0 ? room : std::min(limit, room);
  }
  if (opts_.memory_budget > 0) {
    int64_t need = 0;  // saturating, like state_bytes: an overflow is "more than any budget"
    if (__builtin_mul_overflow(engine_.state_bytes(n_prompt + *req.max_tokens), int64_t{std::max(1, req.n)}, &need))
      need = std::numeric_limits<int64_t>::max();
    if (need > opts_.memory_budget) {
      job.events.push(error_event(400, cat("This request needs ", need, " bytes of cache for its ", n_prompt,
                                           " prompt tokens and up to ", *req.max_tokens, " generated tokens",
                                           req.n > 1 ? cat(" in each of its n = ", req.n, " choices") : std::string(),
                                           charge_explained(engine_.state_charge(), n_prompt + *req.max_tokens),
                                           defaulted ? cat("; the request set no ", req.max_tokens_param, ", so the server's default (",
                                                           *req.max_tokens, " tokens, ", *req.max_tokens == room ? "all the room left in the context" : "its cap",
                                                           ") was reserved")
                                                     : std::string(),
                                           ", more than the server's memory budget of ", opts_.memory_budget,
                                           " bytes (--memory-budget). Please reduce the prompt or ", req.max_tokens_param,
                                           req.n > 1 ? " or n." : "."),
                                  req.n > 1 ? "n" : req.max_tokens_param, "memory_budget_exceeded"));
      return false;
    }
  }
  return true;
}

std::shared_ptr<Job> EngineLoop::submit_task(std::function<void()> task) {
  auto job = std::make_shared<Job>();
  job->task = std::move(task);
  return enqueue(std::move(job));
}

std::shared_ptr<Job> EngineLoop::enqueue(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || queue_.size() >= opts_.max_queue) return nullptr;
    queue_.push_back(job);
  }
  cv_.notify_one();
  return job;
}

size_t EngineLoop::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

int64_t EngineLoop::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

size_t EngineLoop::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_ && !running_->task ? 1 : batch_.size();
}

void EngineLoop::shutdown() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    dropped.swap(queue_);
    if (running_) running_->cancelled = true;
    for (auto& j : batch_) j->cancelled = true;
  }
  cv_.notify_all();
  for (auto& job : dropped) job->events.push(error_event(503, "The server is shutting down."));
  std::lock_guard<std::mutex> join_lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::run() {
  if (engine_.supports_batching() && opts_.max_num_seqs > 1) return run_batched();
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = queue_.front();
      queue_.pop_front();
      running_ = job;
    }
    run_job(*job);
    std::lock_guard<std::mutex> lock(mu_);
    running_.reset();
  }
}

void EngineLoop::run_job(Job& job) {
  if (job.cancelled) {
    job.events.push(error_event(499, "The client closed the request."));
    return;
  }
  if (job.task) {
    try {
      job.task();
      StreamEvent done;
      done.kind = StreamEvent::Kind::kDone;
      job.events.push(std::move(done));
    } catch (const ApiError& e) {
      job.events.push(error_event(e.status(), e.what(), e.param(), e.code()));
    } catch (const Error& e) {
      job.events.push(error_event(400, e.what()));
    } catch (const c10::Error& e) {
      job.events.push(error_event(500, std::string("Internal error: ") + e.what_without_backtrace()));
    } catch (const std::exception& e) {
      job.events.push(error_event(500, std::string("Internal error: ") + e.what()));
    }
    return;
  }
  CompletionRequest& req = job.request;
  const Prompt& prompt = job.prompt;
  const int64_t n_prompt = static_cast<int64_t>(prompt.ids.size());
  try {
    engine_.check_request(req);  // what may have changed since prepare() (adapter ids)
  } catch (const ApiError& e) {
    job.events.push(error_event(e.status(), e.what(), e.param(), e.code()));
    return;
  } catch (const std::exception& e) {
    job.events.push(error_event(400, e.what()));
    return;
  }

  StreamEvent started;
  started.kind = StreamEvent::Kind::kStarted;
  started.prompt_tokens = n_prompt;
  job.events.push(std::move(started));

  // Without batching the n choices of a request are generated one after another (each prefills).
  for (int i = 0; i < std::max(1, req.n); ++i) {
    CompletionRequest choice_req;
    if (i > 0) {
      choice_req = req;
      choice_req.sampling.seed = choice_seed(req.sampling.seed, i);
    }
    const CompletionRequest& r = i > 0 ? choice_req : req;
    OutputStream out(r, prompt, engine_, job.events, i);
    if (i > 0 && job.cancelled) {  // the client left: the remaining choices are cut before they start
      Finish f;
      f.reason = Finish::Reason::kAborted;
      out.finish(f, n_prompt);
      continue;
    }
    try {
      bool cut = false;  // on_token refused a token because the job was cancelled
      Finish f = engine_.generate(prompt, r, [&](const TokenEvent& ev) {
        if (job.cancelled.load(std::memory_order_relaxed)) {
          cut = true;
          return false;
        }
        return out.on_token(ev);
      });
      if (cut && f.reason == Finish::Reason::kStopped) f.reason = Finish::Reason::kAborted;
      out.finish(f, n_prompt);
    } catch (const ApiError& e) {
      job.events.push(error_event(e.status(), e.what(), e.param(), e.code()));
      return;
    } catch (const c10::Error& e) {
      job.events.push(error_event(500, std::string("Generation failed: ") + e.what_without_backtrace()));
      return;
    } catch (const std::exception& e) {
      job.events.push(error_event(500, std::string("Generation failed: ") + e.what()));
      return;
    }
  }
}

// A running generation of the batched path: one choice of a job (a job with n choices has n).
struct EngineLoop::Slot {
  std::shared_ptr<Job> job;
  std::unique_ptr<OutputStream> out;
  std::unique_ptr<ActiveSequence> seq;
  int choice = 0;
  int64_t n_prompt = 0;
  int64_t reserved = 0;  // state bytes it holds against the memory budget
  bool cut = false;  // its on_token refused a token because the job was cancelled
};

bool EngineLoop::admit(std::list<Slot>& slots, const std::shared_ptr<Job>& jobp, int64_t reserved_each) {
  Job& job = *jobp;
  const int n = std::max(1, job.request.n);
  auto fail = [&](StreamEvent ev) {
    job.events.push(std::move(ev));
    release(reserved_each * n);
    return false;
  };
  if (job.cancelled) return fail(error_event(499, "The client closed the request."));
  try {
    engine_.check_request(job.request);  // what may have changed since prepare() (adapter ids)
  } catch (const ApiError& e) {
    return fail(error_event(e.status(), e.what(), e.param(), e.code()));
  } catch (const std::exception& e) {
    return fail(error_event(400, e.what()));
  }
  const int64_t n_prompt = static_cast<int64_t>(job.prompt.ids.size());
  StreamEvent started;
  started.kind = StreamEvent::Kind::kStarted;
  started.prompt_tokens = n_prompt;
  job.events.push(std::move(started));
  std::vector<Slot*> mine;
  std::vector<TokenCallback> callbacks;
  for (int i = 0; i < n; ++i) {
    Slot& slot = slots.emplace_back();
    slot.job = jobp;
    slot.choice = i;
    slot.n_prompt = n_prompt;
    slot.reserved = reserved_each;
    slot.out = std::make_unique<OutputStream>(job.request, job.prompt, engine_, job.events, i);
    Slot* self = &slot;
    mine.push_back(self);
    callbacks.push_back([self](const TokenEvent& ev) {
      if (self->job->cancelled.load(std::memory_order_relaxed)) {
        self->cut = true;
        return false;
      }
      return self->out->on_token(ev);
    });
  }
  std::optional<StreamEvent> error;
  try {
    std::vector<std::unique_ptr<ActiveSequence>> seqs = engine_.start_sequences(job.prompt, job.request, std::move(callbacks));
    HEARTH_CHECK(seqs.size() == mine.size(), "the engine started ", seqs.size(), " sequences for ", n, " choices");
    for (size_t i = 0; i < seqs.size(); ++i) mine[i]->seq = std::move(seqs[i]);
  } catch (const ApiError& e) {
    error = error_event(e.status(), e.what(), e.param(), e.code());
  } catch (const InvalidArgument& e) {
    error = error_event(400, e.what());
  } catch (const c10::Error& e) {
    error = error_event(500, std::string("Generation failed: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    error = error_event(500, std::string("Generation failed: ") + e.what());
  }
  if (error) {
    for (int i = 0; i < n; ++i) slots.pop_back();
    return fail(std::move(*error));
  }
  return true;
}

void EngineLoop::step_all(std::list<Slot>& slots) {
  std::vector<ActiveSequence*> seqs;
  for (Slot& s : slots) seqs.push_back(s.seq.get());
  std::string failure;
  try {
    engine_.step(seqs);
  } catch (const c10::Error& e) {
    failure = e.what_without_backtrace();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty()) {
    // An internal failure leaves every sequence of the step undefined: each request gets the error.
    for (Slot& s : slots) {
      s.job->events.push(error_event(500, "Generation failed: " + failure));
      release(s.reserved);
    }
    slots.clear();
    return;
  }
  for (auto it = slots.begin(); it != slots.end();) {
    if (!it->seq->done()) {
      ++it;
      continue;
    }
    // Its budget is free before its client hears it is done.
    release(it->reserved);
    try {
      Finish f = engine_.finish_sequence(*it->seq);
      if (it->cut && f.reason == Finish::Reason::kStopped) f.reason = Finish::Reason::kAborted;
      it->out->finish(f, it->n_prompt);
    } catch (const ApiError& e) {
      it->job->events.push(error_event(e.status(), e.what(), e.param(), e.code()));
      it->job->cancelled = true;  // the response ends with this error: its other choices stop
    } catch (const std::exception& e) {
      it->job->events.push(error_event(500, std::string("Generation failed: ") + e.what()));
      it->job->cancelled = true;
    }
    it = slots.erase(it);
  }
}

void EngineLoop::release(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= bytes;
}

void EngineLoop::run_batched() {
  std::list<Slot> slots;  // a list: each Slot's address is captured by its sequence's callback
  for (;;) {
    std::shared_ptr<Job> task;
    std::vector<std::shared_ptr<Job>> admitted;
    std::vector<int64_t> admitted_need;  // their reservations (memory budget on)
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (slots.empty()) cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) {
        lock.unlock();
        for (Slot& s : slots) s.job->cancelled = true;
        while (!slots.empty()) step_all(slots);  // each ends at its next token with "abort"
        return;
      }
      size_t seats = 0;  // sequences admitted now (a job with n choices takes n)
      while (!queue_.empty()) {
        if (!queue_.front()->task && queue_.front()->cancelled) {
          // Its client left while it waited: admit() ends it at once (499) without a seat or any
          // budget, so it does not hold up the requests behind it.
          admitted.push_back(queue_.front());
          admitted_need.push_back(0);
          queue_.pop_front();
          continue;
        }
        const size_t n = queue_.front()->task ? 1 : static_cast<size_t>(std::max(1, queue_.front()->request.n));
        if (slots.size() + seats + n > opts_.max_num_seqs && !(slots.empty() && seats == 0)) break;
        int64_t need = 0;  // per choice
        if (opts_.memory_budget > 0 && !queue_.front()->task) {
          // FIFO: the head waits until running generations free enough of the budget.
          const Job& head = *queue_.front();
          need = engine_.state_bytes(static_cast<int64_t>(head.prompt.ids.size()) + head.request.max_tokens.value_or(0));
          if (reserved_ + need * static_cast<int64_t>(n) > opts_.memory_budget && !(slots.empty() && admitted.empty())) break;
          reserved_ += need * static_cast<int64_t>(n);
        }
        if (!queue_.front()->task) {
          admitted_need.push_back(need);
          seats += n;
        }
        if (queue_.front()->task) {
          // Adapter mount/unmount must not race a forward or change a running request's adapters.
          if (slots.empty() && admitted.empty()) {
            task = queue_.front();
            queue_.pop_front();
            running_ = task;
          }
          break;
        }
        admitted.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    if (task) {
      run_job(*task);
      std::lock_guard<std::mutex> lock(mu_);
      running_.reset();
      continue;
    }
    for (size_t i = 0; i < admitted.size(); ++i) admit(slots, admitted[i], admitted_need[i]);
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch_.clear();
      for (Slot& s : slots) batch_.push_back(s.job);
    }
    if (!slots.empty()) step_all(slots);
    std::lock_guard<std::mutex> lock(mu_);
    batch_.clear();
    for (Slot& s : slots) batch_.push_back(s.job);
  }
}

}  // namespace hearth::server
