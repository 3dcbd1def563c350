// HTTP routes of the server: OpenAI chat/completions, Anthropic Messages, OpenAI Responses, models,
// adapters, health, metrics and the web UI; auth, error mapping and request metrics.
// Not request validation (*_parse.cpp), response shapes (*_format.cpp) nor the job bridge
// (generation_route.cpp).
#include "server/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <semaphore>
#include <thread>

#include "core/error.h"
#include "core/printable.h"
#include "server/anthropic_api.h"
#include "server/api_error.h"
#include "server/engine_loop.h"
#include "server/generation_route.h"
#include "server/http_guard.h"
#include "server/http_transport.h"
#include "server/openai_format.h"
#include "server/request_parse.h"
#include "server/responses_api.h"
#include "server/web_assets.h"

namespace hearth::server {
namespace {

using namespace std::chrono_literals;

constexpr const char* kJson = "application/json";

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = {},
                const std::string& code = {}) {
  send_api_error(res, status, message, param, code);
}

bool is_anthropic_path(const std::string& path) { return path == "/v1/messages" || path.rfind("/v1/messages/", 0) == 0; }

// On /v1/messages*, rewrites an OpenAI error body {"error": {...}} into Anthropic's shape {"type":
// "error", "error": {"type", "message"}}: every error there, refusals included, is answered that
// way. Called where the body was set (before httplib compresses it for the client).
void to_anthropic_error(const httplib::Request& req, httplib::Response& res) {
  if (!is_anthropic_path(req.path) || res.status < 400 || res.body.empty()) return;
  ojson j = ojson::parse(res.body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_object() || !j["error"].contains("message")) return;
  if (!j["error"]["message"].is_string()) return;
  res.set_content(dump_json(anthropic_error_json(res.status, j["error"]["message"].get<std::string>())), kJson);
}

// The `route` label of a request: its route pattern, never a raw path (bounded label set).
std::string route_label(const std::string& path) {
  for (const char* r : {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                        "/v1/responses", "/v1/models", "/v1/adapters", "/health", "/metrics", "/"})
    if (path == r) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{model}";
  if (path.rfind("/v1/adapters/", 0) == 0) return "/v1/adapters/{id}";
  for (const auto& a : web_assets())
    if (path == a.path) return "/ui";
  return "other";
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A handler for a route that takes no body. A body, if framed, is not read: the connection is
// closed after the answer instead (its bytes must not be parsed as the next request).
using BodylessHandler = std::function<void(const httplib::Request&, httplib::Response&)>;
httplib::Server::HandlerWithContentReader bodyless(BodylessHandler h) {
  return [h = std::move(h)](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
    const std::string length = req.get_header_value("Content-Length");  // validated by check_request
    if (length.find_first_not_of("0 \t") != std::string::npos || req.has_header("Transfer-Encoding"))
      close_after_response(res);
    h(req, res);
  };
}

// Reads the request body through `read`: at most `max_bytes` decoded bytes, whatever the framing
// (a chunked body is counted as it arrives, not after). On failure answers 413 (too large), 408
// (too slow) or 400 (cut short, bad chunks), closes the connection after it, and returns false.
bool read_body(const httplib::ContentReader& read, const TransportLimits& lim, std::string& body,
               httplib::Response& res) {
  bool too_large = false;
  const bool ok = read([&](const char* data, size_t n) {
    if (body.size() + n > lim.max_body_bytes) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (ok) return true;
  close_after_response(res);
  auto [status, message] = read_failure_answer(too_large ? ReadFailure::kBodyTooLarge : current_read_failure(), 400, lim);
  send_error(res, status, message, "", status == 413 ? "request_too_large" : "");
  return false;
}

// The request headers the access checks read.
RequestHead request_head(const httplib::Request& req) {
  RequestHead h;
  h.method = req.method;
  h.path = req.path;
  h.version = req.version;
  h.host = req.get_header_value("Host");
  h.host_count = req.get_header_value_count("Host");
  h.has_origin = req.has_header("Origin");
  h.origin = req.get_header_value("Origin");
  h.authorization = req.get_header_value("Authorization");
  h.x_api_key = req.get_header_value("x-api-key");
  h.content_type = req.get_header_value("Content-Type");
  h.content_length = req.get_header_value("Content-Length");
  h.content_length_count = req.get_header_value_count("Content-Length");
  h.transfer_encoding = req.get_header_value("Transfer-Encoding");
  h.transfer_encoding_count = req.get_header_value_count("Transfer-Encoding");
  return h;
}

TransportLimits transport_limits(const ServerOptions& o) {
  TransportLimits l;
  l.max_connections = o.max_connections;
  l.idle_timeout_s = o.idle_timeout_s;
  l.header_timeout_s = o.header_timeout_s;
  l.body_timeout_s = o.body_timeout_s;
  l.read_timeout_s = o.read_timeout_s;
  l.max_body_bytes = o.max_body_bytes;
  return l;
}

// Routes and the methods they accept (for 404 vs 405).
constexpr const char* kRoutedMethods = "GET, HEAD, POST, PUT, PATCH, DELETE and OPTIONS";
bool routed_method(const std::string& m) {
  for (const char* r : {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
    if (m == r) return true;
  return false;
}

bool known_path(const std::string& path, std::string& allow) {
  // "/v1/adapters/" and "/v1/models/" with no id are no resource (404), not a method mismatch.
  auto id_under = [&](const char* prefix) {
    const std::string p = prefix;
    return path.size() > p.size() && path.rfind(p, 0) == 0;
  };
  allow = "POST";
  if (path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/responses" || path == "/v1/messages" ||
      path == "/v1/messages/count_tokens")
    return true;
  allow = "GET, POST";
  if (path == "/v1/adapters") return true;
  allow = "DELETE";
  if (id_under("/v1/adapters/")) return true;
  allow = "GET";
  if (path == "/v1/models" || id_under("/v1/models/") || path == "/health" || path == "/metrics" || path == "/")
    return true;
  for (const auto& a : web_assets())
    if (path == a.path) return true;
  return false;
}

}  // namespace

struct Server::Impl {
  Engine& engine;
  ServerOptions opts;
  EngineLoop loop;
  AccessPolicy policy;
  GuardedHttpServer http;
  int64_t started_at = unix_now();
  std::atomic<bool> stopped{false};
  Metrics metrics;
  GenerationContext gen{engine, loop, metrics, stopped, opts.max_queue};
  // count_tokens prompts built at once on HTTP threads (like EngineLoop's prepare slots: cores, at most 8).
  std::counting_semaphore<> count_slots{static_cast<std::ptrdiff_t>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8))};

  static EngineLoopOptions loop_options(const ServerOptions& o) {
    EngineLoopOptions l;
    l.max_queue = o.max_queue;
    l.default_max_tokens_chat = o.default_max_tokens;
    l.default_max_tokens_completion = 512;
    l.max_num_seqs = o.max_num_seqs;
    l.memory_budget = o.memory_budget;
    return l;
  }

  Impl(Engine& e, ServerOptions o)
      : engine(e),
        opts(std::move(o)),
        loop(e, loop_options(opts)),
        policy{opts.host, opts.allowed_hosts, opts.allowed_origins, opts.api_key, opts.max_body_bytes},
        http(transport_limits(opts)) {
    routes();
  }

  ojson model_json() const {
    return ojson{{"id", engine.model_id()},
                 {"object", "model"},
                 {"created", started_at},
                 {"owned_by", "hearth"},
                 {"context_window", engine.context_length()}};
  }

  void routes() {
    // Runs before httplib reads any body: Host, Origin/CORS, auth, framing, Content-Type; then
    // POSTs without a body are answered at once. A refusal closes the connection (the body, if
    // any, is left unread).
    auto pre_route = [this](const httplib::Request& req, httplib::Response& res) {
      const GuardDecision d = check_request(request_head(req), policy);
      if (!d.cors_origin.empty()) {
        res.set_header("Access-Control-Allow-Origin", d.cors_origin);
        if (d.cors_origin != "*") res.set_header("Vary", "Origin");
      }
      if (d.refusal) {
        close_after_response(res);
        send_error(res, d.refusal->status, d.refusal->message, "", d.refusal->code);
        if (d.refusal->status == 401) res.set_header("WWW-Authenticate", "Bearer");
        return httplib::Server::HandlerResponse::Handled;
      }
      if (d.preflight) {
        res.status = 204;
        res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        const std::string asked = req.get_header_value("Access-Control-Request-Headers");
        res.set_header("Access-Control-Allow-Headers",
                       asked.empty() ? "Authorization, Content-Type, x-api-key, anthropic-version" : asked);
        res.set_header("Access-Control-Max-Age", "600");
        if (d.has_body) close_after_response(res);
        return httplib::Server::HandlerResponse::Handled;
      }
      if (req.method == "POST" && !d.has_body) {
        send_error(res, 400, "The request body is empty (no Content-Length or Transfer-Encoding, or Content-Length: "
                             "0): send a JSON object.", "", "invalid_json");
        return httplib::Server::HandlerResponse::Handled;
      }
      // httplib reads bodies of POST/PUT/PATCH/DELETE only; another method's body would be
      // parsed as the next request.
      if (d.has_body && req.method != "POST" && req.method != "PUT" && req.method != "PATCH" && req.method != "DELETE")
        close_after_response(res);
      return httplib::Server::HandlerResponse::Unhandled;
    };
    http.set_pre_routing_handler([pre_route](const httplib::Request& req, httplib::Response& res) {
      const auto handled = pre_route(req, res);
      if (handled == httplib::Server::HandlerResponse::Handled) to_anthropic_error(req, res);
      return handled;
    });

    // After every answer (errors from the pre-routing checks and httplib included): count it.
    http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      metrics.count_request(route_label(req.path), res.status);
    });

    // 503 once stopping (every generation request is refused then), so a load balancer moves on.
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (stopped.load()) {
        res.status = 503;
        res.set_content("{\"status\": \"stopping\"}", kJson);
        return;
      }
      res.set_content("{\"status\": \"ok\"}", kJson);
    });
    // Like /health, needs no API key (it is outside /v1/): scrapers rarely carry one.
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      const Engine::StateCharge c = engine.state_charge();
      const CacheBudgetGauges g{loop.reserved_bytes(), loop.memory_budget(), c.per_token, c.fixed, c.round_to,
                                c.window_per_token, c.window_tokens};
      res.set_content(metrics.render(loop.queued(), g), "text/plain; version=0.0.4; charset=utf-8");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(dump_json(ojson{{"object", "list"}, {"data", ojson::array({model_json()})}}), kJson);
    });
    http.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
      if (req.matches[1] != engine.model_id())
        return send_error(res, 404, "The model '" + std::string(req.matches[1]) + "' does not exist; this server serves '" +
                                        engine.model_id() + "'.", "model", "model_not_found");
      res.set_content(dump_json(model_json()), kJson);
    });
    // POST routes read their body themselves (read_body), so that its size is checked as it arrives.
    using Reader = httplib::ContentReader;
    http.Post("/v1/chat/completions", [this](const httplib::Request&, httplib::Response& res, const Reader& read) {
      std::string body;
      if (read_body(read, http.limits(), body, res)) completion(body, res, true);
    });
    http.Post("/v1/completions", [this](const httplib::Request&, httplib::Response& res, const Reader& read) {
      std::string body;
      if (read_body(read, http.limits(), body, res)) completion(body, res, false);
    });
    http.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res, const Reader& read) {
      std::string body;
      if (read_body(read, http.limits(), body, res)) messages(body, res);
      to_anthropic_error(req, res);
    });
    http.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res, const Reader& read) {
      std::string body;
      if (read_body(read, http.limits(), body, res)) count_tokens(body, res);
      to_anthropic_error(req, res);
    });
    http.Post("/v1/responses", [this](const httplib::Request&, httplib::Response& res, const Reader& read) {
      std::string body;
      if (read_body(read, http.limits(), body, res)) responses(body, res);
    });
    http.Get("/v1/adapters", [this](const httplib::Request&, httplib::Response& res) {
      ojson list = ojson::array();
      for (const auto& a : engine.list_adapters()) list.push_back(adapter_json(a));
      res.set_content(dump_json(ojson{{"object", "list"}, {"adapters", list}}), kJson);
    });
    http.Post("/v1/adapters", [this](const httplib::Request&, httplib::Response& res, const Reader& read) {
      std::string body;
      if (read_body(read, http.limits(), body, res)) mount(body, res);
    });
    http.Delete("/v1/adapters/(.+)", bodyless([this](const httplib::Request& req, httplib::Response& res) {
      const std::string id = req.matches[1];
      auto task = [this, id] {
        if (!engine.unmount_adapter(id))
          throw ApiError(404, "No adapter '" + id + "' is mounted.", "id", "adapter_not_found");
      };
      if (!run_task(task, res)) return;
      res.set_content(dump_json(ojson{{"id", id}, {"object", "adapter"}, {"deleted", true}}), kJson);
    }));
    http.Get("/", [](const httplib::Request&, httplib::Response& res) { serve_asset("/index.html", res); });
    for (const auto& a : web_assets()) {
      std::string path(a.path);
      http.Get(path, [path](const httplib::Request&, httplib::Response& res) { serve_asset(path, res); });
    }
    auto fallback = [](const httplib::Request& req, httplib::Response& res) {
      std::string allow;
      if (known_path(req.path, allow)) {
        res.set_header("Allow", allow);
        send_error(res, 405, "Method " + req.method + " is not allowed for " + req.path + "; use " + allow + ".");
      } else {
        send_error(res, 404, "Unknown route: " + req.method + " " + req.path + ".", "", "unknown_url");
      }
      to_anthropic_error(req, res);
    };
    http.Get(".*", fallback);
    http.Post(".*", bodyless(fallback));
    http.Put(".*", bodyless(fallback));
    http.Patch(".*", bodyless(fallback));
    http.Delete(".*", bodyless(fallback));
    http.Options(".*", fallback);

    // httplib's own errors (a request line, headers or body that could not be read, ...) get an
    // OpenAI body, the status the transport saw (408 too slow, 431/413 too large), and a closed
    // connection: what is left of the request cannot be trusted.
    http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      auto [status, message] = read_failure_answer(current_read_failure(), res.status, http.limits());
      if (status == 400 && current_read_failure() == ReadFailure::kNone && !routed_method(req.method) &&
          !req.method.empty() && req.method.size() <= 32 && !has_control_chars(req.method)) {
        // httplib reads TRACE, CONNECT and methods it does not know as a bad request line.
        status = 501;
        message = "Method " + printable(req.method) + " is not implemented by this server (it answers " + kRoutedMethods + ").";
      } else if (status == 400 && current_read_failure() == ReadFailure::kNone && req.has_header("Content-Encoding")) {
        message = "Malformed request: the body does not decode as its Content-Encoding '" +
                  printable(req.get_header_value("Content-Encoding"), 40) + "' says, or its framing is bad.";
      }
      close_after_response(res);
      send_error(res, status, message, "", status == 413 ? "request_too_large" : "");
      to_anthropic_error(req, res);
      return httplib::Server::HandlerResponse::Handled;
    }));
    http.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      try {
        std::rethrow_exception(ep);
      } catch (const ApiError& e) {
        send_error(res, e.status(), e.what(), e.param(), e.code());
      } catch (const std::exception& e) {
        send_error(res, 500, std::string("Internal server error: ") + e.what());
      } catch (...) {
        send_error(res, 500, "Internal server error.");
      }
      to_anthropic_error(req, res);
    });
  }

  static ojson adapter_json(const AdapterInfo& a) {
    return ojson{{"id", a.id},         {"object", "adapter"}, {"path", a.path},  {"format", a.format},
                 {"rank", a.rank},     {"modules", a.modules}, {"scale", a.scale}};
  }

  // Runs `task` on the engine thread (queued behind running/waiting requests) and waits for it.
  // On failure the error response is sent and false is returned.
  bool run_task(std::function<void()> task, httplib::Response& res) {
    std::shared_ptr<Job> job = loop.submit_task(std::move(task));
    if (!job) {
      send_error(res, stopped ? 503 : 429, stopped ? "The server is shutting down." : "Too many requests waiting; retry later.",
                 "", stopped ? "" : "queue_full");
      return false;
    }
    std::optional<StreamEvent> ev;
    while (!(ev = job->events.pop(200ms))) {
    }
    if (ev->kind == StreamEvent::Kind::kError) {
      send_error(res, ev->status, ev->message, ev->param, ev->code);
      return false;
    }
    return true;
  }

  // POST /v1/adapters {"id", "path"}: mount on the engine thread.
  void mount(const std::string& raw, httplib::Response& res) {
    std::string id, path;
    try {
      ojson body = parse_body(raw);
      for (const char* f : {"id", "path"}) {
        if (!body.contains(f) || !body[f].is_string() || body[f].get<std::string>().empty())
          throw ApiError(400, std::string("'") + f + "' is required and must be a non-empty string.", f);
      }
      id = body["id"].get<std::string>();
      path = body["path"].get<std::string>();
      if (has_control_chars(path))  // a NUL would cut the path short: another folder than the one sent
        throw ApiError(400, "'path' must not contain control characters.", "path");
    } catch (const ApiError& e) {
      return send_error(res, e.status(), e.what(), e.param(), e.code());
    }
    if (!engine.supports_adapters())
      return send_error(res, 501, "This engine does not support LoRA adapters.", "", "adapters_unsupported");
    auto info = std::make_shared<AdapterInfo>();
    if (!run_task([this, id, path, info] { *info = engine.mount_adapter(id, path); }, res)) return;
    res.set_content(dump_json(adapter_json(*info)), kJson);
  }

  static void serve_asset(const std::string& path, httplib::Response& res) {
    for (const auto& a : web_assets()) {
      if (a.path == path) {
        res.set_content(std::string(a.body), std::string(a.content_type));
        res.set_header("Cache-Control", "no-cache");
        // The page loads only its own files and talks only to this server; no other site may
        // frame it (clickjacking its buttons) or have its files sniffed as another type.
        res.set_header("Content-Security-Policy",
                       "default-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'");
        res.set_header("X-Frame-Options", "DENY");
        res.set_header("X-Content-Type-Options", "nosniff");
        res.set_header("Referrer-Policy", "no-referrer");
        return;
      }
    }
    send_error(res, 404, "Unknown route: GET " + path + ".", "", "unknown_url");
  }

  void completion(const std::string& raw, httplib::Response& res, bool chat) {
    const auto arrived = std::chrono::steady_clock::now();
    CompletionRequest creq;
    std::string model;
    try {
      ojson body = parse_body(raw);
      creq = chat ? parse_chat_request(body) : parse_completion_request(body);
      model = resolve_model(engine, creq);
    } catch (const ApiError& e) {
      return send_error(res, e.status(), e.what(), e.param(), e.code());
    }
    ResponseMeta meta{new_response_id(chat), unix_now(), model, chat, creq.stream && creq.include_usage, creq.logprobs, creq.n};
    serve_generation(gen, std::move(creq), std::make_shared<OpenAiWriter>(std::move(meta)), res, arrived);
  }

  // POST /v1/messages (Anthropic): errors get Anthropic's shape in the post-routing handler.
  void messages(const std::string& raw, httplib::Response& res) {
    const auto arrived = std::chrono::steady_clock::now();
    CompletionRequest creq;
    std::string model;
    try {
      creq = parse_anthropic_request(parse_body(raw), /*count_only=*/false);
      model = resolve_model(engine, creq);
    } catch (const ApiError& e) {
      return send_error(res, e.status(), e.what(), e.param(), e.code());
    }
    serve_generation(gen, std::move(creq), std::make_shared<AnthropicWriter>(new_anthropic_message_id(), model), res, arrived);
  }

  // POST /v1/messages/count_tokens: the prompt /v1/messages would run, built but not queued.
  void count_tokens(const std::string& raw, httplib::Response& res) {
    try {
      CompletionRequest creq = parse_anthropic_request(parse_body(raw), /*count_only=*/true);
      resolve_model(engine, creq);
      count_slots.acquire();
      std::unique_ptr<std::counting_semaphore<>, void (*)(std::counting_semaphore<>*)> slot(&count_slots,
                                                                                            [](auto* s) { s->release(); });
      const Prompt p = count_prompt(engine, creq);
      res.set_content(dump_json(ojson{{"input_tokens", p.ids.size()}}), kJson);
    } catch (const ApiError& e) {
      send_error(res, e.status(), e.what(), e.param(), e.code());
    }
  }

  // POST /v1/responses (OpenAI Responses; nothing is stored).
  void responses(const std::string& raw, httplib::Response& res) {
    const auto arrived = std::chrono::steady_clock::now();
    ResponsesRequest r;
    std::string model;
    try {
      r = parse_responses_request(parse_body(raw));
      model = resolve_model(engine, r.req);
    } catch (const ApiError& e) {
      return send_error(res, e.status(), e.what(), e.param(), e.code());
    }
    auto writer = std::make_shared<ResponsesWriter>(new_responses_id(), unix_now(), model, std::move(r.echo));
    serve_generation(gen, std::move(r.req), std::move(writer), res, arrived);
  }
};

Server::Server(Engine& engine, ServerOptions opts) : impl_(std::make_unique<Impl>(engine, std::move(opts))) {}

Server::~Server() { stop(); }

int Server::bind() {
  auto& o = impl_->opts;
  // httplib's default socket options include SO_REUSEPORT, which lets a second server share a
  // port already in use (requests then alternate between them). Keep only SO_REUSEADDR.
  impl_->http.set_socket_options([](auto sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
  });
  HEARTH_CHECK(o.port >= 0 && o.port <= 65535, "serve: --port ", o.port, " is not in 0..65535");
  if (o.port == 0) {
    int port = impl_->http.bind_to_any_port(o.host);
    HEARTH_CHECK(port > 0, "serve: cannot bind ", o.host, " to a free port");
    impl_->http.deepen_backlog(1024);
    return port;
  }
  HEARTH_CHECK(impl_->http.bind_to_port(o.host, o.port), "serve: cannot bind ", o.host, ":", o.port,
               " (in use, or not a local address); pick another port (--port, or HEARTH_PORT for `hearth` alone) or --host");
  impl_->http.deepen_backlog(1024);
  return o.port;
}

void Server::serve() { impl_->http.listen_after_bind(); }

void Server::stop() {
  if (impl_->stopped.exchange(true)) return;
  impl_->loop.shutdown();
  impl_->http.stop();
}

}  // namespace hearth::server
