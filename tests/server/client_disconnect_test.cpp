// A client that closes its connection before its answer, in process (FakeEngine with a per-token
// delay): non-streaming (running or still queued) and streaming requests are cancelled, their
// generation stops, and /metrics counts them. Not the transport's limits (server_transport_test).
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "server_test_util.h"

namespace hearth::server {
namespace {

using namespace hearth::server::testing;
using DisconnectClock = std::chrono::steady_clock;

class ClientDisconnectTest : public ServerTest {
 protected:
  // Opens a connection and sends a whole POST of `body` to `path`; returns the socket.
  int send_post(const std::string& path, const std::string& body) {
    const int fd = connect_raw();
    const std::string raw = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    EXPECT_EQ(::send(fd, raw.data(), raw.size(), 0), static_cast<ssize_t>(raw.size()));
    return fd;
  }
  // The value of one sample line of GET /metrics (-1 when absent).
  double metric(const std::string& sample) {
    auto r = client().Get("/metrics");
    if (!r) return -1;
    const std::string key = sample + " ";
    const size_t at = r->body.find("\n" + key);
    if (at == std::string::npos) return -1;
    return std::stod(r->body.substr(at + 1 + key.size()));
  }
  // Waits up to `limit` for the engine to leave generate(); true when it did.
  bool wait_idle(std::chrono::milliseconds limit) {
    const auto t0 = DisconnectClock::now();
    while (engine_->busy() && DisconnectClock::now() - t0 < limit) std::this_thread::sleep_for(5ms);
    return !engine_->busy();
  }
};

TEST_F(ClientDisconnectTest, NonStreamingClientThatLeavesStopsItsGeneration) {
  start({}, FakeEngineOptions{"fake-model", 4096, 20});
  // 100 tokens of "xxx" at 20 ms each: 2 s if it runs to its end.
  const int fd = send_post("/v1/chat/completions", chat_body("emit:" + std::string(300, 'x')));
  for (int i = 0; i < 200 && engine_->tokens_emitted() < 3; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(engine_->busy());
  ::close(fd);
  const auto t0 = DisconnectClock::now();
  EXPECT_TRUE(wait_idle(1500ms));
  EXPECT_LT(DisconnectClock::now() - t0, 600ms);  // noticed within ~100 ms, then one more token
  EXPECT_EQ(engine_->stopped_early(), 1);
  EXPECT_LT(engine_->tokens_emitted(), 40);
  EXPECT_EQ(metric("hearth_client_disconnects_total{stream=\"false\"}"), 1);
  EXPECT_EQ(metric("hearth_client_disconnects_total{stream=\"true\"}"), 0);
  EXPECT_EQ(metric("hearth_requests_total{route=\"/v1/chat/completions\",status=\"499\"}"), 1);
  // The next request is served at once, not behind the abandoned one.
  engine_->set_token_delay_ms(0);
  const auto t1 = DisconnectClock::now();
  auto r = post("/v1/chat/completions", chat_body("next"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(DisconnectClock::now() - t1, 500ms);
}

TEST_F(ClientDisconnectTest, QueuedNonStreamingRequestWhoseClientLeftNeverStarts) {
  start({}, FakeEngineOptions{"fake-model", 4096, 20});
  // A runs for 30 tokens (0.6 s); B (/v1/messages, Anthropic) waits behind it and its client leaves.
  std::optional<httplib::Result> ra;
  std::thread a([&] { ra.emplace(post("/v1/chat/completions", chat_body("emit:" + std::string(90, 'a')))); });
  for (int i = 0; i < 200 && !engine_->busy(); ++i) std::this_thread::sleep_for(5ms);
  const int fd = send_post("/v1/messages", R"({"model": "fake-model", "max_tokens": 100, "messages": )"
                                           R"([{"role": "user", "content": "emit:)" + std::string(300, 'b') + R"("}]})");
  std::this_thread::sleep_for(100ms);
  ::close(fd);
  a.join();
  ASSERT_TRUE(ra && *ra);
  EXPECT_EQ((*ra)->status, 200);
  std::this_thread::sleep_for(200ms);  // B's turn: dropped before it starts
  EXPECT_TRUE(wait_idle(1000ms));
  EXPECT_EQ(engine_->generations(), 1);
  EXPECT_EQ(engine_->tokens_emitted(), 30);
  EXPECT_EQ(metric("hearth_client_disconnects_total{stream=\"false\"}"), 1);
  EXPECT_EQ(metric("hearth_requests_total{route=\"/v1/messages\",status=\"499\"}"), 1);
}

TEST_F(ClientDisconnectTest, StreamingClientThatLeavesIsCountedToo) {
  start({}, FakeEngineOptions{"fake-model", 4096, 20});
  const int fd = send_post("/v1/chat/completions", chat_body("emit:" + std::string(300, 's'), R"(, "stream": true)"));
  for (int i = 0; i < 200 && engine_->tokens_emitted() < 3; ++i) std::this_thread::sleep_for(5ms);
  ::close(fd);
  EXPECT_TRUE(wait_idle(1500ms));
  EXPECT_EQ(engine_->stopped_early(), 1);
  EXPECT_LT(engine_->tokens_emitted(), 40);
  EXPECT_EQ(metric("hearth_client_disconnects_total{stream=\"true\"}"), 1);
  EXPECT_EQ(metric("hearth_client_disconnects_total{stream=\"false\"}"), 0);
}

// Nothing is written to a queued streaming completion (completions have no first chunk), so no
// write can fail: its socket is looked at instead, and it is dropped before it starts.
TEST_F(ClientDisconnectTest, QueuedStreamingRequestWhoseClientLeftNeverStarts) {
  start({}, FakeEngineOptions{"fake-model", 4096, 20});
  // A runs for 50 tokens (1 s); B streams, waits behind it, and its client leaves.
  std::optional<httplib::Result> ra;
  std::thread a([&] { ra.emplace(post("/v1/chat/completions", chat_body("emit:" + std::string(150, 'a')))); });
  for (int i = 0; i < 200 && !engine_->busy(); ++i) std::this_thread::sleep_for(5ms);
  const int fd = send_post("/v1/completions", R"({"model": "fake-model", "stream": true, "prompt": "emit:)" +
                                                std::string(300, 'b') + R"("})");
  std::this_thread::sleep_for(100ms);
  ::close(fd);
  // Counted while A still runs (it used to wait for B's first write after A).
  for (int i = 0; i < 200 && metric("hearth_client_disconnects_total{stream=\"true\"}") < 1; ++i)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(metric("hearth_client_disconnects_total{stream=\"true\"}"), 1);
  a.join();
  ASSERT_TRUE(ra && *ra);
  EXPECT_EQ((*ra)->status, 200);
  std::this_thread::sleep_for(200ms);  // B's turn: dropped before it starts
  EXPECT_TRUE(wait_idle(1000ms));
  EXPECT_EQ(engine_->generations(), 1);
  EXPECT_EQ(engine_->tokens_emitted(), 50);
}

}  // namespace
}  // namespace hearth::server
