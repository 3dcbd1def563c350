// The request checks of http_guard.h: loopback/host matching, same-origin and CORS decisions,
// Bearer parsing and message framing. Not transport, not routing.
#include "server/http_guard.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

namespace hearth::server {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "a.b.c.d" with each part 0..255 and the first 127.
bool is_loopback_ipv4(std::string_view s) {
  int parts = 0;
  size_t i = 0;
  int first = -1;
  while (i <= s.size()) {
    size_t j = s.find('.', i);
    if (j == std::string_view::npos) j = s.size();
    std::string_view p = s.substr(i, j - i);
    if (!all_digits(p) || p.size() > 3 || std::stoi(std::string(p)) > 255) return false;
    if (parts == 0) first = std::stoi(std::string(p));
    ++parts;
    i = j + 1;
  }
  return parts == 4 && first == 127;
}

// Host and port of an authority ("h", "h:p", "[v6]", "[v6]:p"); port "" when absent.
std::pair<std::string, std::string> split_authority(std::string_view a) {
  a = trim(a);
  if (!a.empty() && a.front() == '[') {
    size_t close = a.find(']');
    if (close == std::string_view::npos) return {lower(a), ""};
    std::string_view rest = a.substr(close + 1);
    return {lower(a.substr(1, close - 1)), rest.size() > 1 && rest.front() == ':' ? std::string(rest.substr(1)) : ""};
  }
  size_t colon = a.rfind(':');
  if (colon != std::string_view::npos && a.find(':') == colon)  // one colon: host:port
    return {lower(a.substr(0, colon)), std::string(a.substr(colon + 1))};
  return {lower(a), ""};  // no port, or a bare IPv6 address
}

bool allowed(const std::vector<std::string>& list, const std::string& value, bool name_only) {
  for (const auto& e : list) {
    if (e == "*") return true;
    if (name_only ? split_authority(e).first == value : lower(trim(e)) == value) return true;
  }
  return false;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The key of an "Authorization: Bearer KEY" value; nullopt for another scheme (RFC 7235: the scheme
// is case-insensitive, one or more spaces before the credentials).
std::optional<std::string_view> bearer_token(std::string_view auth) {
  auth = trim(auth);
  size_t sp = auth.find(' ');
  if (sp == std::string_view::npos || lower(auth.substr(0, sp)) != "bearer") return std::nullopt;
  return trim(auth.substr(sp));
}

// An origin "scheme://host[:port]" as (host, port) with the scheme's default port filled in.
std::optional<std::pair<std::string, std::string>> origin_authority(std::string_view origin) {
  size_t sep = origin.find("://");
  if (sep == std::string_view::npos) return std::nullopt;
  const std::string scheme = lower(origin.substr(0, sep));
  std::string_view rest = origin.substr(sep + 3);
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) rest = rest.substr(0, slash);
  auto [host, port] = split_authority(rest);
  if (port.empty()) port = scheme == "https" ? "443" : "80";
  return std::make_pair(host, port);
}

Refusal refusal(int status, std::string message, std::string code = {}) {
  return Refusal{status, std::move(message), std::move(code)};
}

}  // namespace

std::string host_name(std::string_view host_header) { return split_authority(host_header).first; }

bool is_loopback_host(std::string_view host) {
  std::string h = lower(trim(host));
  if (!h.empty() && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (!h.empty() && h.back() == '.') h.pop_back();  // "localhost." is the same name
  if (h == "localhost" || (h.size() > 10 && h.compare(h.size() - 10, 10, ".localhost") == 0)) return true;
  if (h == "::1" || h == "0:0:0:0:0:0:0:1") return true;
  if (h.rfind("::ffff:", 0) == 0) return is_loopback_ipv4(std::string_view(h).substr(7));
  return is_loopback_ipv4(h);
}

GuardDecision check_request(const RequestHead& req, const AccessPolicy& policy) {
  GuardDecision d;
  // Host: a page that rebinds its own name to 127.0.0.1 still sends its own name here.
  if (req.host_count > 1) {
    d.refusal = refusal(400, "Two Host headers: send one.");
    return d;
  }
  if (req.host_count == 0) {
    if (req.version == "HTTP/1.1") d.refusal = refusal(400, "An HTTP/1.1 request needs a Host header (RFC 9112 section 3.2).");
    if (d.refusal) return d;
  } else if (is_loopback_host(policy.bound_host) || !policy.allowed_hosts.empty()) {
    const std::string name = host_name(req.host);
    if (!is_loopback_host(name) && name != host_name(policy.bound_host) && !allowed(policy.allowed_hosts, name, true)) {
      d.refusal = refusal(403, "Host '" + req.host + "' is not allowed: this server answers to localhost and " +
                                   policy.bound_host + " only; start it with --allowed-hosts " + name +
                                   " to accept that name.", "host_not_allowed");
      return d;
    }
  }

  // Origin: browsers send it on cross-site requests; same-origin pages (the web chat) send their
  // own address, which equals Host.
  if (req.has_origin) {
    const std::string origin = lower(trim(req.origin));
    std::string o = origin;
    while (!o.empty() && o.back() == '/') o.pop_back();
    if (allowed(policy.allowed_origins, o, false)) {
      const bool any = std::find(policy.allowed_origins.begin(), policy.allowed_origins.end(), "*") != policy.allowed_origins.end();
      d.cors_origin = any ? "*" : std::string(trim(req.origin));
      if (req.method == "OPTIONS") {
        d.preflight = true;
        return d;
      }
    } else {
      auto oa = origin_authority(o);
      auto [h, p] = split_authority(req.host);
      if (p.empty()) p = "80";
      if (!oa || oa->first != h || oa->second != p) {
        d.refusal = refusal(403, "Cross-origin request from '" + std::string(trim(req.origin)) +
                                     "' refused; start the server with --allowed-origins " + std::string(trim(req.origin)) +
                                     " to allow that site.", "origin_not_allowed");
        return d;
      }
    }
  }

  if (!policy.api_key.empty() && req.path.rfind("/v1/", 0) == 0) {
    auto token = bearer_token(req.authorization);
    const bool bearer_ok = token && constant_time_equal(*token, policy.api_key);
    const bool x_key_ok = !req.x_api_key.empty() && constant_time_equal(trim(req.x_api_key), policy.api_key);
    if (!bearer_ok && !x_key_ok) {
      d.refusal = refusal(401, req.authorization.empty() && req.x_api_key.empty()
                                   ? "Missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')."
                                   : "Incorrect API key provided.",
                          "invalid_api_key");
      return d;
    }
  }

  // Framing (RFC 9112 section 6): anything ambiguous is refused before a byte of body is read.
  uint64_t length = 0;
  if (req.content_length_count > 1) {
    d.refusal = refusal(400, "Two Content-Length headers: send one.", "invalid_request");
    return d;
  }
  if (req.content_length_count == 1) {
    std::string_view cl = trim(req.content_length);
    if (!all_digits(cl) || cl.size() > 18) {
      d.refusal = refusal(400, "Content-Length '" + req.content_length + "' is not a non-negative decimal number.",
                          "invalid_request");
      return d;
    }
    length = std::stoull(std::string(cl));
  }
  bool chunked = false;
  if (req.transfer_encoding_count > 0) {
    if (req.transfer_encoding_count > 1 || req.content_length_count > 0) {
      d.refusal = refusal(400, req.content_length_count > 0 ? "Both Content-Length and Transfer-Encoding: send one."
                                                            : "Two Transfer-Encoding headers: send one.",
                          "invalid_request");
      return d;
    }
    if (lower(trim(req.transfer_encoding)) != "chunked") {
      d.refusal = refusal(501, "Transfer-Encoding '" + req.transfer_encoding + "' is not supported; send the body as is "
                               "(with Content-Length) or chunked.", "invalid_request");
      return d;
    }
    chunked = true;
  }
  if (length > policy.max_body_bytes) {
    d.refusal = refusal(413, "Request body too large: " + std::to_string(length) + " bytes; this server accepts at most " +
                                 std::to_string(policy.max_body_bytes) + " (--max-body-bytes).", "request_too_large");
    return d;
  }
  d.has_body = length > 0 || chunked;

  if (req.method == "POST") {
    std::string_view ct = req.content_type;
    if (size_t semi = ct.find(';'); semi != std::string_view::npos) ct = ct.substr(0, semi);
    if (lower(trim(ct)) != "application/json") {
      d.refusal = refusal(415, "Content-Type must be application/json" +
                                   (req.content_type.empty() ? std::string(" (none was sent)") : " (got '" + req.content_type + "')") +
                                   "; e.g. curl -H 'Content-Type: application/json'.", "unsupported_media_type");
      return d;
    }
  }
  return d;
}

}  // namespace hearth::server
