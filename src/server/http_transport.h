// The server's HTTP transport under cpp-httplib 0.11's routing: one thread per connection (started
// on demand, capped), per-phase read deadlines and byte caps, idle-connection eviction at the cap.
// Not routing or request policy (server.cpp, http_guard.h): httplib still parses and dispatches.
#pragma once
#include <httplib.h>

#include <atomic>
#include <cstddef>
#include <list>
#include <mutex>
#include <string>
#include <utility>

namespace hearth::server {

/// What the transport enforces on every connection. Times in seconds.
struct TransportLimits {
  /// Connections served at once (each has its own thread while open). A new connection past the
  /// cap evicts the connection idle longest (between requests, no byte of a request read); when
  /// none is idle it is answered 503 (code "too_many_connections") and closed at once.
  size_t max_connections = 256;
  int idle_timeout_s = 2;     ///< wait for the first byte of a request (keep-alive included)
  int header_timeout_s = 10;  ///< first byte of a request -> end of its headers (else 408)
  int body_timeout_s = 60;    ///< end of the headers -> end of the body (else 408)
  int read_timeout_s = 5;     ///< longest silence inside a request line, headers or body (else 400)
  int write_timeout_s = 30;   ///< longest wait for the client to take response bytes
  size_t max_header_bytes = 64u << 10;  ///< request line + headers (else 431)
  /// Raw bytes of one request body as read off the wire, chunk framing included: 2 * this + 64 KiB
  /// at most (else 413). The exact --max-body-bytes check on the decoded body is the route's
  /// (read_body in server.cpp); this bounds the framing an attacker could stream beside it.
  size_t max_body_bytes = 16u << 20;
};

/// Why reading the current request failed, as the transport saw it (for the error handler).
enum class ReadFailure {
  kNone,
  kSilence,          ///< read_timeout_s without a byte
  kHeaderTimeout,    ///< header_timeout_s passed
  kBodyTimeout,      ///< body_timeout_s passed
  kHeadersTooLarge,  ///< more than max_header_bytes
  kBodyTooLarge,     ///< more raw body bytes than the cap
};

/// The read failure of the request being handled on this thread (kNone outside a connection).
ReadFailure current_read_failure();
/// Status and one-line message for a request whose line, headers or body could not be read:
/// from `failure` (what the transport saw), else from `status` (httplib's own answer: 400, 413,
/// 414 for a request target over CPPHTTPLIB_REQUEST_URI_MAX_LENGTH, ...).
std::pair<int, std::string> read_failure_answer(ReadFailure failure, int status, const TransportLimits& lim);
/// Whether the client of the request being handled on this thread has closed its connection (or
/// it was reset): a non-blocking peek at the socket, which reads nothing (an end of stream or an
/// error there means the client left; bytes waiting, e.g. a pipelined request, mean it did not).
/// A client that only shut down its sending side counts as gone, as nginx and uvicorn treat it.
/// False outside a GuardedHttpServer connection. For handlers that wait long before answering
/// (a non-streaming generation) and want to stop work nobody will read.
bool current_client_closed();
/// Closes the connection after the current response (and says so with "Connection: close"):
/// for answers given before the request body was read, or after a failed read, so that unread
/// body bytes are never parsed as the next request.
void close_after_response(httplib::Response& res);

/// httplib::Server with the transport above: it replaces httplib's per-connection loop
/// (process_and_close_socket, a virtual hook in 0.11) and its fixed thread pool. httplib's own
/// loop gives a slow client unlimited time as long as each line arrives within the read timeout,
/// and queues new connections behind busy threads (a few slow or idle clients then starve
/// /health); this one bounds each phase and never queues a connection behind another.
class GuardedHttpServer : public httplib::Server {
 public:
  explicit GuardedHttpServer(TransportLimits limits);
  ~GuardedHttpServer() override;

  /// Re-listens on the bound socket with this backlog (httplib listens with 5).
  void deepen_backlog(int backlog);
  /// Connections open now, and refused so far because of the cap (for tests and logs).
  size_t open_connections() const;
  size_t refused_connections() const { return refused_; }
  const TransportLimits& limits() const { return limits_; }

  struct Conn;  // one connection: its socket, phase, deadlines and read buffer (http_transport.cpp)

 private:
  bool process_and_close_socket(socket_t sock) override;
  bool admit(Conn& c);
  void release(Conn& c);
  bool set_idle(Conn& c, bool idle);  ///< false when c was evicted
  bool stopping() const { return svr_sock_ == INVALID_SOCKET; }

  TransportLimits limits_;
  mutable std::mutex mu_;
  std::list<Conn*> conns_;  // registered connections (guarded by mu_)
  size_t active_ = 0;       // registered and not evicted
  std::atomic<size_t> refused_{0};
};

}  // namespace hearth::server
