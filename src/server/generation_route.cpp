// One generation request from submit to its last byte, for every API (see generation_route.h).
// Not the engine thread (engine_loop.cpp) and not any API's JSON shapes (the writers).
#include "server/generation_route.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "core/error.h"
#include "nn/linear.h"
#include "server/api_error.h"
#include "server/http_transport.h"
#include "server/openai_format.h"

namespace hearth::server {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Records one request's metrics from its events; ends its "running" span when destroyed.
class RequestMetrics {
 public:
  /// `choices`: the request's n (its kDone events; the request ends with the last).
  RequestMetrics(Metrics& m, Clock::time_point arrived, int choices = 1)
      : m_(m), arrived_(arrived), choices_(std::max(1, choices)) {}
  ~RequestMetrics() { stop_running(); }
  RequestMetrics(const RequestMetrics&) = delete;
  RequestMetrics& operator=(const RequestMetrics&) = delete;

  void on_event(const StreamEvent& ev) {
    const auto now = Clock::now();
    switch (ev.kind) {
      case StreamEvent::Kind::kStarted:
        m_.observe_queue(seconds_between(arrived_, now));
        m_.add_prompt_tokens(ev.prompt_tokens);
        m_.add_running(+1);
        running_ = true;
        break;
      case StreamEvent::Kind::kDelta:
        if (!first_ && (!ev.text.empty() || !ev.reasoning.empty())) first_output(now);
        break;
      case StreamEvent::Kind::kDone: {
        if (!first_ && ev.completion_tokens > 0) first_output(now);  // all output was held (a tool call)
        if (first_ && ev.completion_tokens >= 2)
          m_.observe_itl(seconds_between(*first_, now) / static_cast<double>(ev.completion_tokens - 1),
                         static_cast<uint64_t>(ev.completion_tokens - 1));
        completion_ += ev.completion_tokens;
        cached_ = std::max(cached_, ev.cached_tokens);
        if (++ended_ < choices_) break;  // n choices: the request ends with the last one
        m_.observe_duration(seconds_between(arrived_, now));
        m_.add_generation(GenerationSample{ev.prompt_tokens, completion_, cached_});
        stop_running();
        break;
      }
      case StreamEvent::Kind::kError:
        stop_running();
        break;
    }
  }

 private:
  void first_output(Clock::time_point now) {
    first_ = now;
    m_.observe_ttft(seconds_between(arrived_, now));
  }
  void stop_running() {
    if (running_) m_.add_running(-1);
    running_ = false;
  }

  Metrics& m_;
  Clock::time_point arrived_;
  std::optional<Clock::time_point> first_;
  bool running_ = false;
  int choices_ = 1, ended_ = 0;
  int64_t completion_ = 0, cached_ = 0;  // summed over the choices ended so far
};

// Streaming state shared by the content provider and its releaser.
struct StreamState {
  std::shared_ptr<Job> job;
  std::shared_ptr<ResponseWriter> writer;
  std::unique_ptr<RequestMetrics> metrics;
  StreamEvent started;
  int choices = 1;  // kDone events that end the stream (the request's n)
  int ended = 0;
  bool began = false;
  bool finished = false;
  Clock::time_point last_write = Clock::now();  // SSE keep-alive comments after 5 s of silence
};

// A non-streaming request's client, checked while its handler waits: nothing is written to it
// before the answer, so only a look at its socket (current_client_closed) shows that it left.
// Looks at most every 100 ms (a poll and a peek each: negligible beside a decode step).
class ClientWatch {
 public:
  bool left() {
    const auto now = Clock::now();
    if (now < next_) return false;
    next_ = now + 100ms;
    return current_client_closed();
  }

 private:
  Clock::time_point next_ = Clock::now() + 100ms;
};

}  // namespace

void send_api_error(httplib::Response& res, int status, const std::string& message, const std::string& param,
                    const std::string& code) {
  res.status = status;
  res.set_content(dump_json(error_json(status, message, param, code)), "application/json");
}

std::string resolve_model(const Engine& engine, CompletionRequest& req) {
  if (req.model.empty() || req.model == engine.model_id()) return engine.model_id();
  for (const auto& a : engine.list_adapters()) {
    if (a.id != req.model) continue;
    if (!req.adapter) {
      req.adapter = a.id;
    } else {
      // An explicit selection decides, but must include the adapter 'model' names ("a+b" with
      // model "a" is fine): otherwise the response would name one adapter and run another.
      std::vector<std::string> ids;
      try {
        ids = nn::parse_adapter_spec(*req.adapter);
      } catch (const InvalidArgument& e) {  // as the engine's own check of the selection
        throw ApiError(400, e.what(), "adapter", "invalid_value");
      }
      if (std::find(ids.begin(), ids.end(), a.id) == ids.end())
        throw ApiError(400, "'model' names the adapter '" + a.id + "' but 'adapter' selects '" + *req.adapter +
                                "' without it: send one of them, or include it.", "adapter", "invalid_value");
    }
    return a.id;
  }
  throw ApiError(404, "The model `" + req.model + "` does not exist.", "model", "model_not_found");
}

Prompt count_prompt(Engine& engine, const CompletionRequest& req) {
  const int64_t ctx = engine.context_length();
  if (const int64_t per_token = engine.max_token_bytes(); per_token > 0) {
    const uint64_t bytes = request_text_bytes(req);
    if (bytes > static_cast<uint64_t>(ctx) * static_cast<uint64_t>(per_token))
      throw ApiError(400, cat("This model's maximum context length is ", ctx, " tokens. However, your messages (with tools and chat_template_kwargs) hold ", bytes,
                              " bytes of text, more than ", ctx, " tokens can cover (one token is at most ", per_token,
                              " bytes). Please reduce the length of the messages."),
                     "messages", "context_length_exceeded");
  }
  try {
    return engine.prepare(req);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  } catch (const c10::Error& e) {
    throw ApiError(500, std::string("Internal error while building the prompt: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw ApiError(500, std::string("Internal error while building the prompt: ") + e.what());
  }
}

void serve_generation(const GenerationContext& ctx, CompletionRequest req, std::shared_ptr<ResponseWriter> writer,
                      httplib::Response& res, Clock::time_point arrived) {
  const bool stream = req.stream;
  const int choices = std::max(1, req.n);
  std::shared_ptr<Job> job = ctx.loop.submit(std::move(req));
  if (!job) {
    if (ctx.stopped) return send_api_error(res, 503, "The server is shutting down.");
    res.set_header("Retry-After", "1");
    return send_api_error(res, 429, "Too many requests waiting (" + std::to_string(ctx.max_queue) + " queued); retry later.",
                          "", "queue_full");
  }
  auto metrics = std::make_unique<RequestMetrics>(ctx.metrics, arrived, choices);
  // The first event decides the status: kStarted (200) or kError (4xx/5xx before any output). A
  // streaming request still waiting in the queue gets its headers and first chunk at once (then SSE
  // keep-alive comments) instead, so a proxy with a short idle timeout does not drop it; an error
  // after that (rare: its adapter unmounted meanwhile, shutdown) arrives as an error event.
  // A non-streaming client that leaves cancels its job as a streaming one does (its write fails):
  // a queued job is then dropped at admission, a running one ends at its next token, and its
  // decode slot and memory budget are freed at once. Answered 499 (nginx's "client closed
  // request"), which nobody reads but the request metrics count.
  ClientWatch watch;
  auto abandon = [&] {
    job->cancelled = true;
    ctx.metrics.count_client_disconnect(false);
    close_after_response(res);
    send_api_error(res, 499, "The client closed the request.", "", "client_closed_request");
  };
  std::optional<StreamEvent> first;
  while (!(first = job->events.pop(stream ? 50ms : 100ms)) && !stream) {
    if (watch.left()) return abandon();
  }
  if (first) {
    metrics->on_event(*first);
    if (first->kind == StreamEvent::Kind::kError)
      return send_api_error(res, first->status, first->message, first->param, first->code);
  } else {
    first.emplace();  // still queued: begin with what is already known (the prompt was built at submit)
    first->kind = StreamEvent::Kind::kStarted;
    first->prompt_tokens = static_cast<int64_t>(job->prompt.ids.size());
  }

  if (!stream) {
    std::vector<StreamEvent> deltas, dones;
    for (;;) {
      if (watch.left()) return abandon();  // also between events: a decoding job sends one per token
      auto ev = job->events.pop(100ms);
      if (!ev) continue;
      metrics->on_event(*ev);
      if (ev->kind == StreamEvent::Kind::kDelta) {
        deltas.push_back(std::move(*ev));
      } else if (ev->kind == StreamEvent::Kind::kDone) {
        dones.push_back(std::move(*ev));
        if (static_cast<int>(dones.size()) < choices) continue;
        res.set_content(writer->full_choices(deltas, dones), "application/json");
        return;
      } else {
        return send_api_error(res, ev->status, ev->message, ev->param, ev->code);
      }
    }
  }

  auto st = std::make_shared<StreamState>();
  st->job = job;
  st->choices = choices;
  st->writer = std::move(writer);
  st->metrics = std::move(metrics);
  st->started = std::move(*first);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        std::string out;
        if (!st->began) {
          st->began = true;
          out += st->writer->begin(st->started);
        }
        // Wait briefly for an event, then take every event already queued (one write).
        auto ev = st->job->events.pop(out.empty() ? 200ms : 0ms);
        if (!ev && out.empty() && current_client_closed()) {
          // Nothing is written while the request waits in the queue or prefills a long prompt, so
          // no write can fail: a look at the socket (as for non-streaming requests) shows the
          // client left, and the job is dropped at once (at admission, or at the next prompt chunk).
          st->job->cancelled = true;
          return false;
        }
        const auto now = Clock::now();
        if (!ev && out.empty() && now - st->last_write > std::chrono::seconds(5)) out = ": keep-alive\n\n";
        bool end = false;
        while (ev) {
          st->metrics->on_event(*ev);
          if (ev->kind == StreamEvent::Kind::kDelta) {
            out += st->writer->delta(*ev);
          } else if (ev->kind == StreamEvent::Kind::kDone) {
            out += st->writer->end(*ev);
            if (++st->ended < st->choices) {
              ev = st->job->events.pop(0ms);
              continue;
            }
            end = true;
            break;
          } else if (ev->kind == StreamEvent::Kind::kError) {
            out += st->writer->error(*ev);
            end = true;
            break;
          }
          ev = st->job->events.pop(0ms);
        }
        if (!out.empty()) st->last_write = now;
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          st->job->cancelled = true;  // the client went away: stop generating
          return false;
        }
        if (end) {
          st->finished = true;
          sink.done();
        }
        return true;
      },
      [st, &m = ctx.metrics](bool) {
        if (st->finished) return;
        st->job->cancelled = true;  // the client went away (or a write failed): stop generating
        m.count_client_disconnect(true);
      });
}

}  // namespace hearth::server
