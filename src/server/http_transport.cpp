// GuardedHttpServer: the connection loop (idle wait, header and body phases with deadlines and
// byte caps, keep-alive), the on-demand thread pool and the connection cap with idle eviction.
// Not HTTP parsing: httplib::Server::process_request reads the request through Conn (a Stream).
#include "server/http_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <system_error>
#include <thread>
#include <vector>

namespace hearth::server {

using Clock = std::chrono::steady_clock;

namespace {

// httplib's TaskQueue with a thread per job, started on demand up to `max_threads` (then jobs
// wait for a free thread). Every accepted connection is one job, so with max_threads above the
// connection cap a new connection never waits behind a busy one.
class OnDemandPool : public httplib::TaskQueue {
 public:
  explicit OnDemandPool(size_t max_threads) : max_threads_(std::max<size_t>(1, max_threads)) {}
  ~OnDemandPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fn));
    if (jobs_.size() > idle_ && threads_.size() < max_threads_) {
      try {
        threads_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        // The system is out of threads: the job waits for a running one to free up.
      }
    }
    cv_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_) return;
      shut_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();  // no enqueue after shut_, so threads_ no longer changes
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++idle_;
        cv_.wait(lock, [&] { return shut_ || !jobs_.empty(); });
        --idle_;
        if (jobs_.empty()) return;  // shut down and drained
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  const size_t max_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool shut_ = false;
};

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                : ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc != 0) return;
  char buf[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

// Closes a connection that may still hold unread request bytes the "lingering" way (as Apache
// does): stop sending, then read and drop input for up to `wait` or `max_bytes`, then close.
// Closing at once would make the kernel answer the unread bytes with a reset, which can destroy
// the response before the client reads it.
void lingering_close(int fd, std::chrono::milliseconds wait, size_t max_bytes) {
  ::shutdown(fd, SHUT_WR);
  const auto end = Clock::now() + wait;
  size_t drained = 0;
  char buf[4096];
  while (drained < max_bytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
    if (n > 0) drained += static_cast<size_t>(n);
  }
  ::close(fd);
}

// A whole response with an OpenAI error body, "Connection: close", written without blocking (the
// transport's own answers, before or instead of httplib's). `message` holds no character JSON
// would escape.
void send_error_now(int fd, int status, const char* reason, const std::string& message, const char* code,
                    const char* extra_headers = "") {
  const std::string type = status >= 500 ? "server_error" : "invalid_request_error";
  const std::string body = "{\"error\": {\"message\": \"" + message + "\", \"type\": \"" + type +
                           "\", \"param\": null, \"code\": " + (*code ? "\"" + std::string(code) + "\"" : "null") + "}}";
  const std::string msg = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                          "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                          "\r\nConnection: close\r\n" + extra_headers + "\r\n" + body;
  [[maybe_unused]] ssize_t n = ::send(fd, msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

// Answers a connection over the cap without reading it: a 503, then close.
void refuse(int fd, size_t cap) {
  send_error_now(fd, 503, "Service Unavailable", "Too many open connections (" + std::to_string(cap) + "); retry later.",
                 "too_many_connections", "Retry-After: 1\r\n");
  lingering_close(fd, std::chrono::milliseconds(200), 64u << 10);
}

std::string too_large_message(const TransportLimits& lim) {
  return "Request body too large: this server accepts at most " + std::to_string(lim.max_body_bytes) +
         " bytes (--max-body-bytes).";
}

// Still connected? A readable socket with nothing to read (end of stream) or in error means the
// peer closed or reset it. Reads nothing: MSG_PEEK.
bool peer_closed(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char c;
  ssize_t n;
  do n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK;
}

thread_local GuardedHttpServer::Conn* tls_conn = nullptr;

}  // namespace

// One connection as an httplib::Stream: reads are buffered and bounded by the phase's deadline,
// silence timeout and byte cap; waits are sliced (100 ms) so that a stopping server is noticed.
struct GuardedHttpServer::Conn : httplib::Stream {
  enum class Phase { kHeaders, kBody };

  Conn(int fd, const TransportLimits& l, const std::atomic<socket_t>& svr) : sock(fd), lim(l), svr_sock(svr) {}

  bool is_readable() const override { return off < len || wait(POLLIN, Clock::now() + secs(lim.read_timeout_s), true); }

  bool is_writable() const override {
    if (!wait(POLLOUT, Clock::now() + secs(lim.write_timeout_s), false)) return false;
    return !peer_closed(sock);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (off == len) {
      const Clock::time_point silence = Clock::now() + secs(lim.read_timeout_s);
      if (!wait(POLLIN, std::min(silence, deadline), true)) {
        if (failure == ReadFailure::kNone)
          failure = Clock::now() >= deadline ? (phase == Phase::kHeaders ? ReadFailure::kHeaderTimeout : ReadFailure::kBodyTimeout)
                                             : ReadFailure::kSilence;
        return -1;
      }
      ssize_t n;
      do n = ::recv(sock, buf, sizeof buf, 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      phase_bytes += static_cast<size_t>(n);
      const size_t cap = phase == Phase::kHeaders ? lim.max_header_bytes : 2 * lim.max_body_bytes + (64u << 10);
      if (phase_bytes > cap) {
        failure = phase == Phase::kHeaders ? ReadFailure::kHeadersTooLarge : ReadFailure::kBodyTooLarge;
        return -1;
      }
      off = 0;
      len = static_cast<size_t>(n);
    }
    const size_t k = std::min(size, len - off);
    std::memcpy(ptr, buf + off, k);
    off += k;
    return static_cast<ssize_t>(k);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!wait(POLLOUT, Clock::now() + secs(lim.write_timeout_s), false)) return -1;
    ssize_t n;
    do n = ::send(sock, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n > 0) written += static_cast<size_t>(n);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address_of(sock, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address_of(sock, false, ip, port); }
  socket_t socket() const override { return sock; }

  /// Starts a phase: its deadline runs from now and its byte count from zero.
  void begin(Phase p, int timeout_s) {
    phase = p;
    deadline = Clock::now() + secs(timeout_s);
    phase_bytes = 0;
    failure = ReadFailure::kNone;
  }
  bool buffered() const { return off < len; }

  /// Waits until the socket is ready for `events` (or in error: the next call reports it), until
  /// `until`; false on timeout, and when `stop_aware` and the server is stopping.
  bool wait(short events, Clock::time_point until, bool stop_aware) const {
    for (;;) {
      if (stop_aware && svr_sock == INVALID_SOCKET) return false;
      const Clock::time_point now = Clock::now();
      if (now >= until) return false;  // so that a caller seeing false knows `until` has passed
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
      pollfd p{sock, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100)));
      if (r > 0 || (r < 0 && errno != EINTR)) return true;
    }
  }
  static Clock::duration secs(int s) { return std::chrono::seconds(s); }

  const int sock;
  const TransportLimits& lim;
  const std::atomic<socket_t>& svr_sock;
  Phase phase = Phase::kHeaders;
  Clock::time_point deadline = Clock::time_point::max();
  size_t phase_bytes = 0;
  ReadFailure failure = ReadFailure::kNone;
  size_t written = 0;  // response bytes sent on this connection
  bool close_requested = false;
  // Guarded by GuardedHttpServer::mu_:
  bool idle = false;
  bool evicted = false;
  Clock::time_point idle_since{};

 private:
  char buf[4096];
  size_t off = 0, len = 0;
};

ReadFailure current_read_failure() { return tls_conn ? tls_conn->failure : ReadFailure::kNone; }

std::pair<int, std::string> read_failure_answer(ReadFailure failure, int status, const TransportLimits& lim) {
  switch (failure) {
    case ReadFailure::kHeaderTimeout:
      return {408, "Request headers not received within " + std::to_string(lim.header_timeout_s) + " s."};
    case ReadFailure::kBodyTimeout:
      return {408, "Request body not received within " + std::to_string(lim.body_timeout_s) + " s."};
    case ReadFailure::kHeadersTooLarge:
      return {431, "Request line and headers exceed " + std::to_string(lim.max_header_bytes) + " bytes."};
    case ReadFailure::kBodyTooLarge:
      return {413, too_large_message(lim)};
    case ReadFailure::kSilence:
      return {400, "Request cut short: the client sent nothing for " + std::to_string(lim.read_timeout_s) +
                       " s in the middle of it (a body shorter than its Content-Length, or a bad chunk size?)."};
    case ReadFailure::kNone:
      break;
  }
  if (status == 413) return {413, too_large_message(lim)};
  if (status == 414)
    return {414, "Request target too long: this server reads request lines of at most " +
                     std::to_string(CPPHTTPLIB_REQUEST_URI_MAX_LENGTH) + " bytes."};
  if (status == 400) return {400, "Malformed request: bad request line, headers or body framing."};
  return {status, "HTTP error " + std::to_string(status) + "."};
}

bool current_client_closed() { return tls_conn && peer_closed(tls_conn->sock); }

void close_after_response(httplib::Response& res) {
  res.set_header("Connection", "close");
  if (tls_conn) tls_conn->close_requested = true;
}

GuardedHttpServer::GuardedHttpServer(TransportLimits limits) : limits_(limits) {
  // Headroom over the cap: threads that only refuse or finish an evicted connection.
  const size_t threads = limits_.max_connections + 64;
  new_task_queue = [threads] { return new OnDemandPool(threads); };
  set_payload_max_length(limits_.max_body_bytes);
  set_read_timeout(limits_.read_timeout_s);
  set_write_timeout(limits_.write_timeout_s);
  set_keep_alive_timeout(limits_.idle_timeout_s);
}

GuardedHttpServer::~GuardedHttpServer() = default;

void GuardedHttpServer::deepen_backlog(int backlog) { ::listen(svr_sock_, backlog); }

size_t GuardedHttpServer::open_connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
}

bool GuardedHttpServer::admit(Conn& c) {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_ >= limits_.max_connections) {
    Conn* victim = nullptr;
    for (Conn* o : conns_)
      if (o->idle && !o->evicted && (!victim || o->idle_since < victim->idle_since)) victim = o;
    if (!victim) return false;
    victim->evicted = true;
    ::shutdown(victim->sock, SHUT_RDWR);  // its thread wakes, sees `evicted` and closes it
    --active_;
  }
  conns_.push_back(&c);
  ++active_;
  return true;
}

void GuardedHttpServer::release(Conn& c) {
  std::lock_guard<std::mutex> lock(mu_);
  conns_.remove(&c);
  if (!c.evicted) --active_;
}

bool GuardedHttpServer::set_idle(Conn& c, bool idle) {
  std::lock_guard<std::mutex> lock(mu_);
  c.idle = idle;
  if (idle) c.idle_since = Clock::now();
  return !c.evicted;
}

bool GuardedHttpServer::process_and_close_socket(socket_t sock) {
  Conn c(sock, limits_, svr_sock_);
  if (!admit(c)) {
    ++refused_;
    refuse(sock, limits_.max_connections);
    return false;
  }
  tls_conn = &c;
  bool ret = false;
  constexpr size_t kMaxRequestsPerConnection = 1000;
  for (size_t n = 0; n < kMaxRequestsPerConnection && !stopping(); ++n) {
    if (!c.buffered()) {  // a pipelined request may already be in the buffer
      set_idle(c, true);
      const bool ready = c.wait(POLLIN, Clock::now() + Conn::secs(limits_.idle_timeout_s), true);
      if (!set_idle(c, false) || !ready) break;
    }
    c.begin(Conn::Phase::kHeaders, limits_.header_timeout_s);
    c.close_requested = false;
    bool closed = false;
    const size_t written = c.written;
    ret = process_request(c, n + 1 == kMaxRequestsPerConnection, closed,
                          [&c, this](httplib::Request&) { c.begin(Conn::Phase::kBody, limits_.body_timeout_s); });
    if (!ret && c.written == written && c.failure != ReadFailure::kNone) {
      // httplib answers nothing when the request line itself could not be read (too long, too
      // slow): say why, as for the headers (408 / 431 / 400), then close.
      const auto [status, message] = read_failure_answer(c.failure, 400, limits_);
      send_error_now(sock, status, status == 408 ? "Request Timeout" : status == 431 ? "Request Header Fields Too Large" : "Bad Request",
                     message, "");
      c.close_requested = true;
    }
    if (!ret || closed || c.close_requested) break;
  }
  tls_conn = nullptr;
  release(c);
  if (c.close_requested) {
    lingering_close(sock, std::chrono::milliseconds(500), 1u << 20);
  } else {
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
  }
  return ret;
}

}  // namespace hearth::server
