// `hearth serve`'s HTTP server: OpenAI-compatible routes (chat, completions, responses, models),
// Anthropic Messages, health, Prometheus metrics, the embedded web UI, auth, limits, SSE
// streaming, over cpp-httplib, feeding one EngineLoop.
// Not the engine and not JSON parsing details (request_parse.h, openai_format.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/engine.h"

namespace hearth::server {

struct ServerOptions {
  std::string host = "127.0.0.1";  ///< bind address (loopback by default)
  int port = 8080;                 ///< 0 = pick a free port (see Server::bind)
  /// When set, /v1/* needs "Authorization: Bearer <key>" or "x-api-key: <key>" (else 401);
  /// /health and /metrics never do.
  std::string api_key;
  /// Host header names accepted besides loopback names and `host` ("*" = any; see AccessPolicy in
  /// http_guard.h). Empty: a loopback-bound server answers loopback names only (DNS rebinding).
  std::vector<std::string> allowed_hosts;
  /// Origins allowed cross-origin, with CORS headers ("*" = any). Empty: browser requests from
  /// other origins are refused (403) and no CORS header is sent.
  std::vector<std::string> allowed_origins;
  size_t max_queue = 64;           ///< requests waiting for the engine; more -> 429 with Retry-After
  size_t max_num_seqs = 32;        ///< requests generated together (continuous batching; vLLM's --max-num-seqs)
  /// Cache bytes the running requests may hold together (EngineLoopOptions::memory_budget; 0 = none).
  int64_t memory_budget = 0;
  size_t max_body_bytes = 16u << 20;  ///< larger request bodies (chunked ones too) -> 413
  /// Connections open at once (one thread each); past it the longest-idle one is closed, or the
  /// new one gets a 503 when none is idle. Requests waiting for the engine hold one each.
  size_t max_connections = 256;
  int64_t default_max_tokens = 0;  ///< chat limit when a request sets none; 0 = context length
  /// Seconds a connection may stay silent while its request line, headers or body are read. A
  /// body shorter than its Content-Length is only detected when this runs out, so it is short;
  /// then the answer is a 400. A POST with no Content-Length/Transfer-Encoding, or Content-Length
  /// 0, is answered 400 at once.
  int read_timeout_s = 5;
  int header_timeout_s = 10;  ///< request line + headers must arrive within this (else 408)
  int body_timeout_s = 60;    ///< the body must arrive within this after the headers (else 408)
  int idle_timeout_s = 2;     ///< an open connection may wait this long for its next request
};

/// The server. Lifecycle: construct, bind(), serve() (blocks) — stop() from any thread (or a
/// signal watcher) cuts the running generation (its answer, streamed or not, ends with what was
/// generated and finish_reason "abort", as vLLM reports aborted requests), fails queued requests
/// with 503, and makes serve() return. Every error is answered in OpenAI's shape
/// {"error": {"message", "type", "param", "code"}} (param/code null when they do not apply;
/// Anthropic's {"type": "error", "error": {"type", "message"}} under /v1/messages) and the
/// server keeps serving. A client that disconnects cancels its generation, streamed (the write
/// fails) or not (its socket is looked at every 100 ms while the handler waits): the job leaves
/// its queue place or decode slot at once; hearth_client_disconnects_total{stream} counts them.
class Server {
 public:
  Server(Engine& engine, ServerOptions opts);
  ~Server();  ///< stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds host:port; returns the bound port (useful with port 0). Throws hearth::Error when the
  /// address cannot be bound.
  int bind();
  /// Serves until stop(). Requires bind().
  void serve();
  /// Stops serving; thread-safe and idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hearth::server
