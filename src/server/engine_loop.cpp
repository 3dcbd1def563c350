// EngineLoop: bounded FIFO + one worker thread that owns every call into the Engine.
// Not a batching scheduler (one request at a time); that comes with src/generate/ batching.
#include "server/engine_loop.h"

#include <c10/util/Exception.h>

#include <algorithm>

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
}  // namespace

EngineLoop::EngineLoop(Engine& engine, EngineLoopOptions opts) : engine_(engine), opts_(opts) {
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() { shutdown(); }

std::shared_ptr<Job> EngineLoop::submit(CompletionRequest req) {
  auto job = std::make_shared<Job>();
  job->request = std::move(req);
  return enqueue(std::move(job));
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

void EngineLoop::shutdown() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    dropped.swap(queue_);
    if (running_) running_->cancelled = true;
  }
  cv_.notify_all();
  for (auto& job : dropped) job->events.push(error_event(503, "The server is shutting down."));
  std::lock_guard<std::mutex> join_lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::run() {
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
  Prompt prompt;
  try {
    prompt = engine_.prepare(req);
  } catch (const ApiError& e) {
    job.events.push(error_event(e.status(), e.what(), e.param(), e.code()));
    return;
  } catch (const InvalidArgument& e) {
    job.events.push(error_event(400, e.what()));
    return;
  } catch (const Error& e) {
    job.events.push(error_event(400, e.what()));
    return;
  } catch (const c10::Error& e) {
    job.events.push(error_event(500, std::string("Internal error while building the prompt: ") + e.what_without_backtrace()));
    return;
  } catch (const std::exception& e) {
    job.events.push(error_event(500, std::string("Internal error while building the prompt: ") + e.what()));
    return;
  }
  const int64_t n_prompt = static_cast<int64_t>(prompt.ids.size());
  const int64_t ctx = engine_.context_length();
  if (n_prompt >= ctx) {
    job.events.push(error_event(413, cat("The prompt is ", n_prompt, " tokens, but this model's context length is ", ctx,
                                         " tokens (prompt plus at least one generated token must fit).")));
    return;
  }
  const int64_t room = ctx - n_prompt;
  if (req.max_tokens && *req.max_tokens > room) {
    // OpenAI / vLLM: a client limit that cannot fit is refused, not silently lowered.
    job.events.push(error_event(400, cat("max_tokens (or max_completion_tokens) is too large: ", *req.max_tokens,
                                         ". This model's context length is ", ctx, " tokens and the prompt has ",
                                         n_prompt, " tokens, so at most ", room, " tokens can be generated (", *req.max_tokens,
                                         " > ", ctx, " - ", n_prompt, ")."),
                                "max_tokens", "context_length_exceeded"));
    return;
  }
  if (!req.max_tokens) {
    // The server's default (chat: --max-tokens, completions: 512) is only a cap: clamp it to the
    // room left; 0 fills the context.
    int64_t limit = req.chat ? opts_.default_max_tokens_chat : opts_.default_max_tokens_completion;
    req.max_tokens = limit <= 0 ? room : std::min(limit, room);
  }

  StreamEvent started;
  started.kind = StreamEvent::Kind::kStarted;
  started.prompt_tokens = n_prompt;
  job.events.push(std::move(started));

  OutputStream out(req, prompt, engine_, job.events);
  try {
    bool cut = false;  // on_token refused a token because the job was cancelled
    Finish f = engine_.generate(prompt, req, [&](const TokenEvent& ev) {
      if (job.cancelled.load(std::memory_order_relaxed)) {
        cut = true;
        return false;
      }
      return out.on_token(ev);
    });
    if (cut && f.reason == Finish::Reason::kStopped) f.reason = Finish::Reason::kAborted;
    out.finish(f, n_prompt);
  } catch (const c10::Error& e) {
    job.events.push(error_event(500, std::string("Generation failed: ") + e.what_without_backtrace()));
  } catch (const std::exception& e) {
    job.events.push(error_event(500, std::string("Generation failed: ") + e.what()));
  }
}

}  // namespace hearth::server
