// The bridge every generation route shares (chat, completions, Anthropic Messages, OpenAI
// Responses): the `model` check, EngineLoop::submit, the wait for the first event (which decides
// the status), then a JSON body or an SSE stream written by the route's ResponseWriter, with the
// Prometheus metrics recorded as the events pass. Not request parsing and not any API's shapes.
#pragma once
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "server/engine.h"
#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/response_writer.h"

namespace hearth::server {

/// Answers `status` with OpenAI's error body {"error": {message, type, param, code}}.
void send_api_error(httplib::Response& res, int status, const std::string& message, const std::string& param = {},
                    const std::string& code = {});

/// What a generation route needs from the server.
struct GenerationContext {
  Engine& engine;
  EngineLoop& loop;
  Metrics& metrics;
  const std::atomic<bool>& stopped;  ///< the server is shutting down (a refused submit is 503, not 429)
  size_t max_queue = 0;              ///< for the 429 message
};

/// Checks req.model against what this server serves, like vLLM: "" (absent) or the served
/// model id are the model itself; the id of a mounted LoRA adapter selects that adapter when the
/// request names none in `adapter` (as vLLM serves LoRA modules by model name). Returns the id to
/// echo as `model` in the response. Throws ApiError(404, "The model `x` does not exist.",
/// param "model", code "model_not_found") otherwise.
std::string resolve_model(const Engine& engine, CompletionRequest& req);


/// Builds `req`'s prompt without generating (token counting): the early size check above (400
/// context_length_exceeded, param "messages"), then Engine::prepare on the calling thread.
/// Throws ApiError: 400 for a request the model cannot serve (hearth::Error), 500 otherwise.
Prompt count_prompt(Engine& engine, const CompletionRequest& req);

/// Submits `req` (already validated and resolve_model()ed) and answers through `writer`:
/// queue full -> 429 "queue_full" (503 while stopping); a kError first event -> its status in
/// OpenAI's shape; otherwise 200 with writer->full() (non-streaming) or an SSE stream of
/// writer->begin/delta/end/error (req.stream). A client that leaves cancels the job: streaming,
/// when a write fails; non-streaming, when current_client_closed() says so (checked every 100 ms
/// while waiting; the request is then answered 499 "client_closed_request", which nobody reads).
/// Both count in Metrics::count_client_disconnect.
/// `arrived`: when the request arrived (for TTFT and duration). Metrics: prompt tokens at start,
/// running sequences while generating, TTFT at the first delta, ITL, duration, generated and
/// cached tokens at kDone.
void serve_generation(const GenerationContext& ctx, CompletionRequest req, std::shared_ptr<ResponseWriter> writer,
                      httplib::Response& res, std::chrono::steady_clock::time_point arrived);

}  // namespace hearth::server
