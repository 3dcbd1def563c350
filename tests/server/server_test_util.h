// The in-process server fixture shared by the server tests: FakeEngine + Server on an ephemeral
// port, an httplib client, raw-socket exchanges and OpenAI error-shape checks. Not a test itself.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/fake_engine.h"
#include "server/server.h"

namespace hearth::server::testing {

using J = nlohmann::json;
using namespace std::chrono_literals;

class ServerTest : public ::testing::Test {
 protected:
  void start(ServerOptions opts = {}, FakeEngineOptions fo = {}) {
    opts.host = "127.0.0.1";
    opts.port = 0;
    engine_ = std::make_unique<FakeEngine>(fo);
    server_ = std::make_unique<Server>(*engine_, opts);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(10, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body, const httplib::Headers& h = {}) {
    return client().Post(path.c_str(), h, body, "application/json");
  }
  static std::string chat_body(const std::string& user, const std::string& extra = "") {
    return R"({"model": "fake-model", "messages": [{"role": "user", "content": )" + J(user).dump() + "}]" + extra + "}";
  }
  // Checks SSE framing and returns the JSON payloads (without the final [DONE]).
  static std::vector<J> sse_events(const std::string& body, bool expect_done = true) {
    std::vector<J> out;
    size_t pos = 0;
    bool done = false;
    while (pos < body.size()) {
      size_t end = body.find("\n\n", pos);
      EXPECT_NE(end, std::string::npos) << "unterminated event at " << pos;
      if (end == std::string::npos) break;
      std::string ev = body.substr(pos, end - pos);
      pos = end + 2;
      EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
      EXPECT_FALSE(done) << "event after [DONE]";
      if (ev == "data: [DONE]") done = true;
      else out.push_back(J::parse(ev.substr(6)));
    }
    EXPECT_EQ(done, expect_done);
    return out;
  }
  // Named SSE events ("event: <name>\ndata: <json>\n\n", as Anthropic and the Responses API
  // send them): (name, payload) in order; checks the framing and that each payload's "type" is
  // its event name.
  static std::vector<std::pair<std::string, J>> named_sse_events(const std::string& body) {
    std::vector<std::pair<std::string, J>> out;
    size_t pos = 0;
    while (pos < body.size()) {
      size_t end = body.find("\n\n", pos);
      EXPECT_NE(end, std::string::npos) << "unterminated event at " << pos;
      if (end == std::string::npos) break;
      std::string ev = body.substr(pos, end - pos);
      pos = end + 2;
      size_t nl = ev.find('\n');
      EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
      EXPECT_NE(nl, std::string::npos) << ev;
      if (nl == std::string::npos) break;
      EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
      std::string name = ev.substr(7, nl - 7);
      J data = J::parse(ev.substr(nl + 7));
      EXPECT_EQ(data["type"], name) << ev;
      out.emplace_back(std::move(name), std::move(data));
    }
    return out;
  }
  // Sends `raw` bytes on a fresh connection, keeps it open, and returns what the server answers
  // (read until the server closes or `wait` passes) and how long the first bytes took.
  struct RawReply {
    std::string text;
    std::chrono::milliseconds first_byte{0};
  };
  RawReply raw_exchange(const std::string& raw, std::chrono::milliseconds wait = 3000ms) {
    RawReply out;
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    timeval tv{0, 100 * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    EXPECT_EQ(::send(fd, raw.data(), raw.size(), 0), static_cast<ssize_t>(raw.size()));
    const auto t0 = std::chrono::steady_clock::now();
    char buf[4096];
    while (std::chrono::steady_clock::now() - t0 < wait) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n == 0) break;
      if (n < 0) {
        // Timed out this round; once a whole response is in, stop waiting.
        if (out.text.find("\r\n\r\n") != std::string::npos && out.text.back() == '}') break;
        continue;
      }
      if (out.text.empty())
        out.first_byte = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
      out.text.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
  }
  // A connected raw socket to the server (receive timeout 100 ms).
  int connect_raw() const {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    timeval tv{0, 100 * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
  }
  // Everything the server sends on `fd` until it closes, a whole JSON response is in, or `wait` passes.
  static std::string read_reply(int fd, std::chrono::milliseconds wait = 3000ms) {
    std::string text;
    const auto t0 = std::chrono::steady_clock::now();
    char buf[4096];
    while (std::chrono::steady_clock::now() - t0 < wait) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n == 0) break;
      if (n < 0) {
        if (text.find("\r\n\r\n") != std::string::npos && text.back() == '}') break;
        continue;
      }
      text.append(buf, static_cast<size_t>(n));
    }
    return text;
  }
  // The status and JSON body of a raw HTTP reply (0 and null when there is none).
  static std::pair<int, J> parse_reply(const std::string& reply) {
    std::pair<int, J> out{0, J()};
    if (reply.rfind("HTTP/1.1 ", 0) == 0) out.first = std::stoi(reply.substr(9, 3));
    size_t b = reply.find("\r\n\r\n");
    if (b != std::string::npos) out.second = J::parse(reply.substr(b + 4), nullptr, false);
    return out;
  }
  static void expect_error(const httplib::Result& r, int status, const std::string& param = "",
                           const std::string& code = "") {
    ASSERT_TRUE(r) << "no response";
    EXPECT_EQ(r->status, status) << r->body;
    J j = J::parse(r->body);
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    EXPECT_TRUE(j["error"]["type"].is_string());
    EXPECT_TRUE(j["error"].contains("param"));
    EXPECT_TRUE(j["error"].contains("code"));
    if (!param.empty()) EXPECT_EQ(j["error"]["param"], param) << r->body;
    if (!code.empty()) EXPECT_EQ(j["error"]["code"], code) << r->body;
  }

  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace hearth::server::testing
