// The server's transport under hostile clients, in process (FakeEngine): chunked bodies over
// --max-body-bytes, slow and drip-fed headers, idle and busy connections at the cap, oversized
// headers and request lines, unknown methods, ambiguous framing, and a prompt that is slow to build.
#include <poll.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "server_test_util.h"

namespace hearth::server {
namespace {

using namespace hearth::server::testing;
using Clock = std::chrono::steady_clock;

std::chrono::milliseconds since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
}

class TransportTest : public ServerTest {};

TEST_F(TransportTest, ChunkedBodyOverTheLimitIs413) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  start(o);
  // A valid chat body sent chunked: under the limit it is served, over it refused.
  auto send_chunked = [&](const std::string& body) {
    return client().Post(
        "/v1/chat/completions",
        [body](size_t offset, httplib::DataSink& sink) {
          if (offset < body.size()) sink.write(body.data() + offset, std::min<size_t>(1000, body.size() - offset));
          else sink.done();
          return true;
        },
        "application/json");
  };
  auto ok = send_chunked(chat_body("small chunked"));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  auto big = send_chunked(chat_body(std::string(8000, 'a')));
  expect_error(big, 413, "", "request_too_large");
  EXPECT_NE(J::parse(big->body)["error"]["message"].get<std::string>().find("4096"), std::string::npos) << big->body;
  EXPECT_EQ(engine_->generations(), 1);
}

TEST_F(TransportTest, EndlessChunkedBodyIsCutAtTheLimit) {
  ServerOptions o;
  o.max_body_bytes = 64 << 10;
  start(o);
  int fd = connect_raw();
  const std::string head =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  // Stream 1 KiB chunks until the server stops taking them (it closes the connection after its 413).
  std::atomic<size_t> sent{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    const std::string chunk = "400\r\n" + std::string(1024, 'a') + "\r\n";
    while (!stop && sent < (256u << 20)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      ssize_t n = ::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
  });
  const auto t0 = Clock::now();
  std::string reply = read_reply(fd, 5000ms);
  stop = true;
  writer.join();
  ::close(fd);
  auto [status, body] = parse_reply(reply);
  EXPECT_EQ(status, 413) << reply.substr(0, 300);
  EXPECT_EQ(body["error"]["code"], "request_too_large") << reply.substr(0, 300);
  EXPECT_LT(since(t0), 3000ms);
  EXPECT_LT(sent.load(), 64u << 20);  // the server did not swallow the stream
  EXPECT_EQ(post("/v1/chat/completions", chat_body("after"))->status, 200);
}

TEST_F(TransportTest, SlowHeaderClientsDoNotStarveHealthOrTheEngine) {
  start();
  // 100 clients that sent a request line and are in no hurry with the rest (within every timeout).
  std::vector<int> slow;
  for (int i = 0; i < 100; ++i) {
    int fd = connect_raw();
    const std::string line = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    EXPECT_EQ(::send(fd, line.data(), line.size(), MSG_NOSIGNAL), static_cast<ssize_t>(line.size()));
    slow.push_back(fd);
  }
  std::this_thread::sleep_for(300ms);
  auto t0 = Clock::now();
  auto h = client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_LT(since(t0), 1000ms);
  t0 = Clock::now();
  EXPECT_EQ(post("/v1/chat/completions", chat_body("still here"))->status, 200);
  EXPECT_LT(since(t0), 1000ms);
  for (int fd : slow) ::close(fd);
}

TEST_F(TransportTest, DripFedHeadersGet408AtTheHeaderDeadline) {
  ServerOptions o;
  o.header_timeout_s = 1;
  start(o);
  int fd = connect_raw();
  const std::string line = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  ::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
  const auto t0 = Clock::now();
  std::string reply;
  char buf[4096];
  // One header line every 200 ms (each well within the 5 s read timeout), for up to 5 s.
  while (since(t0) < 5000ms && reply.find("\r\n\r\n") == std::string::npos) {
    ::send(fd, "X-Drip: 1\r\n", 11, MSG_NOSIGNAL);
    std::this_thread::sleep_for(200ms);
    ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) reply.append(buf, static_cast<size_t>(n));
  }
  reply += read_reply(fd, 500ms);
  ::close(fd);
  auto [status, body] = parse_reply(reply);
  EXPECT_EQ(status, 408) << reply;
  EXPECT_NE(body["error"]["message"].get<std::string>().find("headers not received within 1 s"), std::string::npos) << reply;
  EXPECT_GE(since(t0), 800ms);
  EXPECT_LT(since(t0), 2500ms);
}

TEST_F(TransportTest, IdleConnectionsDoNotDelayHealth) {
  start();  // 256 connections at most
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(connect_raw());
  std::this_thread::sleep_for(300ms);
  const auto t0 = Clock::now();
  auto h = client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_LT(since(t0), 1000ms);
  for (int fd : idle) ::close(fd);
}

TEST_F(TransportTest, BusyConnectionsAtTheCapGet503AndTheCapFreesUp) {
  ServerOptions o;
  o.max_connections = 4;
  start(o);
  std::vector<int> busy;
  for (int i = 0; i < 4; ++i) {
    int fd = connect_raw();
    ::send(fd, "GET /health HTTP/1.1\r\n", 22, MSG_NOSIGNAL);  // mid-request: not idle, not evictable
    busy.push_back(fd);
  }
  std::this_thread::sleep_for(300ms);
  const auto t0 = Clock::now();
  auto refused = client().Get("/health");
  EXPECT_LT(since(t0), 1000ms);
  expect_error(refused, 503, "", "too_many_connections");
  for (int fd : busy) ::close(fd);
  std::this_thread::sleep_for(300ms);
  auto h = client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST_F(TransportTest, OversizedHeadersAre431) {
  start();
  std::string req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (int i = 0; i < 2000; ++i) req += "X-Pad-" + std::to_string(i) + ": " + std::string(40, 'p') + "\r\n";
  req += "\r\n";
  RawReply r = raw_exchange(req);
  auto [status, body] = parse_reply(r.text);
  EXPECT_EQ(status, 431) << r.text.substr(0, 300);
  EXPECT_TRUE(body["error"]["message"].is_string()) << r.text.substr(0, 300);
}

// A request line past the header cap never ends for httplib (it answers nothing then): the
// transport answers 431 itself. A target over httplib's URI limit is a 414 that says so, and a
// method httplib does not route (TRACE, CONNECT, unknown) a 501 naming it.
TEST_F(TransportTest, RequestLineFailuresAreAnswered) {
  start();
  RawReply r = raw_exchange("GET /" + std::string(100000, 'a') + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  auto [status, body] = parse_reply(r.text);
  EXPECT_EQ(status, 431) << r.text.substr(0, 300);
  EXPECT_NE(body["error"]["message"].get<std::string>().find("Request line and headers exceed"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("Connection: close"), std::string::npos) << r.text;
  r = raw_exchange("GET /" + std::string(9000, 'a') + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  std::tie(status, body) = parse_reply(r.text);
  EXPECT_EQ(status, 414) << r.text.substr(0, 300);
  EXPECT_NE(body["error"]["message"].get<std::string>().find("Request target too long"), std::string::npos) << r.text;
  for (const std::string m : {"TRACE", "CONNECT", "FOO"}) {
    r = raw_exchange(m + " /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    std::tie(status, body) = parse_reply(r.text);
    EXPECT_EQ(status, 501) << m << ": " << r.text.substr(0, 300);
    EXPECT_NE(body["error"]["message"].get<std::string>().find("Method " + m + " is not implemented"), std::string::npos)
        << r.text;
  }
  auto h = client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST_F(TransportTest, AmbiguousFramingIsRefusedAtOnce) {
  start();
  const std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  const std::string body = chat_body("x");
  const std::string n = std::to_string(body.size());
  struct Case {
    std::string headers;
    int status;
  };
  for (const Case& c : {Case{"Content-Length: " + n + "\r\nContent-Length: " + n + "\r\n", 400},
                        Case{"Content-Length: -5\r\n", 400},
                        Case{"Content-Length: 12abc\r\n", 400},
                        Case{"Content-Length: " + n + "\r\nTransfer-Encoding: chunked\r\n", 400},
                        Case{"Transfer-Encoding: gzip\r\n", 501}}) {
    RawReply r = raw_exchange(head + c.headers + "\r\n" + body);
    auto [status, json] = parse_reply(r.text);
    EXPECT_EQ(status, c.status) << c.headers << r.text;
    EXPECT_TRUE(json["error"]["message"].is_string()) << r.text;
    EXPECT_LT(r.first_byte, 500ms) << c.headers;
    EXPECT_NE(r.text.find("Connection: close"), std::string::npos) << r.text;
  }
  EXPECT_EQ(engine_->generations(), 0);
}

TEST_F(TransportTest, AHugePromptIsRefusedBeforeItIsBuilt) {
  // 8 tokens of at most 4 bytes: more than 32 bytes of message text cannot fit.
  FakeEngineOptions fo;
  fo.context_length = 8;
  fo.max_token_bytes = 4;
  start({}, fo);
  auto r = post("/v1/chat/completions", chat_body(std::string(100000, 'a')));
  expect_error(r, 400, "messages", "context_length_exceeded");
  EXPECT_NE(J::parse(r->body)["error"]["message"].get<std::string>().find("100000 bytes"), std::string::npos) << r->body;
  expect_error(post("/v1/completions", R"({"prompt": ")" + std::string(33, 'b') + R"("})"), 400, "prompt",
               "context_length_exceeded");
  EXPECT_EQ(engine_->prepares(), 0);  // never templated nor tokenized
  EXPECT_EQ(post("/v1/chat/completions", chat_body("short"))->status, 200);
}

TEST_F(TransportTest, PromptsAreBuiltOffTheEngineThread) {
  start();
  // The fake engine takes 1.5 s to build this prompt; other requests must not wait for it.
  std::optional<httplib::Result> slow;
  std::thread t([&] { slow.emplace(post("/v1/chat/completions", chat_body("__slow_prepare__ words"))); });
  for (int i = 0; i < 100 && engine_->prepares() == 0; ++i) std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(50ms);
  const auto t0 = Clock::now();
  EXPECT_EQ(post("/v1/chat/completions", chat_body("quick"))->status, 200);
  EXPECT_LT(since(t0), 800ms);
  t.join();
  ASSERT_TRUE(slow && *slow);
  EXPECT_EQ((*slow)->status, 200);
}

TEST_F(TransportTest, StopIsPromptWithSlowClientsConnected) {
  start();
  std::vector<int> slow;
  for (int i = 0; i < 50; ++i) {
    int fd = connect_raw();
    ::send(fd, "GET /health HTTP/1.1\r\n", 22, MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);
  const auto t0 = Clock::now();
  server_->stop();
  thread_.join();
  EXPECT_LT(since(t0), 1500ms);
  for (int fd : slow) ::close(fd);
}

}  // namespace
}  // namespace hearth::server
