// Who may talk to the server and in what framing, decided from a request's headers before its body
// is read: Host (DNS rebinding), Origin (cross-site pages) and CORS, the API key, message framing
// (Content-Length / Transfer-Encoding) and the JSON Content-Type of POSTs. Pure functions over
// header values; not the transport (http_transport.h) nor routing (server.cpp).
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hearth::server {

/// The access policy of one server (from ServerOptions).
struct AccessPolicy {
  std::string bound_host;  ///< the --host address the server listens on
  /// Host header names accepted besides loopback names and bound_host ("*" = any). Empty and
  /// bound to a non-loopback address: any Host (the operator exposed the server on purpose).
  std::vector<std::string> allowed_hosts;
  /// Origins (scheme://host[:port], or "*") allowed cross-origin, with CORS headers. Empty: only
  /// same-origin browser requests (Origin's host:port equal to Host), no CORS headers.
  std::vector<std::string> allowed_origins;
  std::string api_key;  ///< "" = no auth
  size_t max_body_bytes = 16u << 20;
};

/// A refusal: the HTTP status and OpenAI error fields. The connection is closed after it.
struct Refusal {
  int status = 400;
  std::string message;
  std::string code;  ///< OpenAI `code` ("" = null)
};

/// The headers of one request that the checks read ("" = absent; counts for repeatable ones).
struct RequestHead {
  std::string method;
  std::string path;
  std::string version;  ///< "HTTP/1.1" | "HTTP/1.0"
  std::string host;
  size_t host_count = 0;
  std::string origin;
  bool has_origin = false;
  std::string authorization;
  std::string x_api_key;  ///< Anthropic clients send the key as "x-api-key: <key>"
  std::string content_type;
  std::string content_length;
  size_t content_length_count = 0;
  std::string transfer_encoding;
  size_t transfer_encoding_count = 0;
};

/// What to do with a request: refuse it, or serve it (adding CORS headers when cors_origin is set:
/// the value for Access-Control-Allow-Origin).
struct GuardDecision {
  std::optional<Refusal> refusal;
  std::string cors_origin;
  bool preflight = false;  ///< an allowed CORS preflight (OPTIONS): answer 204 with the CORS headers
  bool has_body = false;   ///< Content-Length > 0 or chunked
};

/// Runs every check in order — Host (403 host_not_allowed; a missing Host in HTTP/1.1 is 400),
/// Origin (403 origin_not_allowed), CORS preflight, API key on /v1/* (401 invalid_api_key; either
/// "Authorization: Bearer <key>", the scheme matched case-insensitively, RFC 7235, or Anthropic's
/// "x-api-key: <key>"; /health and /metrics need none), framing (400 for two Content-Length
/// headers, one that is not a non-negative decimal, or both Content-Length and Transfer-Encoding;
/// 501 for a transfer coding other than chunked; 413 for a Content-Length over max_body_bytes),
/// POST without application/json (415 unsupported_media_type) — and returns the first refusal.
GuardDecision check_request(const RequestHead& req, const AccessPolicy& policy);

/// True for names and addresses that reach only this machine: "localhost", "*.localhost" (RFC
/// 6761), 127.0.0.0/8, ::1 (bracketed or not), ::ffff:127.x.y.z. No DNS lookup.
bool is_loopback_host(std::string_view host);
/// The host part of a Host header value: "[::1]:8080" -> "::1", "a.b:80" -> "a.b", lowercased.
std::string host_name(std::string_view host_header);

}  // namespace hearth::server
