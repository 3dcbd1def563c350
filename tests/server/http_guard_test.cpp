// check_request and its helpers on header values alone: loopback names, Host and Origin decisions,
// CORS, Bearer parsing, framing and Content-Type, and the order of the checks.
#include "server/http_guard.h"

#include <gtest/gtest.h>

namespace hearth::server {
namespace {

RequestHead get(const std::string& host) {
  RequestHead h;
  h.method = "GET";
  h.path = "/v1/models";
  h.version = "HTTP/1.1";
  h.host = host;
  h.host_count = 1;
  return h;
}

RequestHead post_json(const std::string& host, const std::string& length = "2") {
  RequestHead h = get(host);
  h.method = "POST";
  h.path = "/v1/chat/completions";
  h.content_type = "application/json";
  h.content_length = length;
  h.content_length_count = 1;
  return h;
}

AccessPolicy loopback() {
  AccessPolicy p;
  p.bound_host = "127.0.0.1";
  return p;
}

int status_of(const GuardDecision& d) { return d.refusal ? d.refusal->status : 0; }

TEST(HttpGuard, LoopbackNames) {
  for (const char* h : {"localhost", "LocalHost", "localhost.", "app.localhost", "127.0.0.1", "127.255.0.9", "::1",
                        "[::1]", "::ffff:127.0.0.1", "0:0:0:0:0:0:0:1"})
    EXPECT_TRUE(is_loopback_host(h)) << h;
  for (const char* h : {"", "localhost.example", "evil-localhost", "128.0.0.1", "127.0.0", "127.0.0.1.5", "127.0.0.256",
                        "0.0.0.0", "::", "10.0.0.1", "example.com", "::ffff:10.0.0.1"})
    EXPECT_FALSE(is_loopback_host(h)) << h;
  EXPECT_EQ(host_name("[::1]:8080"), "::1");
  EXPECT_EQ(host_name("Example.COM:80"), "example.com");
  EXPECT_EQ(host_name("::1"), "::1");
}

TEST(HttpGuard, HostOfALoopbackServer) {
  AccessPolicy p = loopback();
  EXPECT_EQ(status_of(check_request(get("127.0.0.1:8080"), p)), 0);
  EXPECT_EQ(status_of(check_request(get("localhost:8080"), p)), 0);
  GuardDecision d = check_request(get("attacker.example:8080"), p);
  EXPECT_EQ(status_of(d), 403);
  EXPECT_EQ(d.refusal->code, "host_not_allowed");
  EXPECT_NE(d.refusal->message.find("--allowed-hosts attacker.example"), std::string::npos) << d.refusal->message;
  p.allowed_hosts = {"attacker.example"};
  EXPECT_EQ(status_of(check_request(get("attacker.example:8080"), p)), 0);
  EXPECT_EQ(status_of(check_request(get("other.example"), p)), 403);
  p.allowed_hosts = {"*"};
  EXPECT_EQ(status_of(check_request(get("other.example"), p)), 0);
  // Missing or doubled Host.
  RequestHead none = get("");
  none.host_count = 0;
  EXPECT_EQ(status_of(check_request(none, p)), 400);
  none.version = "HTTP/1.0";
  EXPECT_EQ(status_of(check_request(none, p)), 0);
  RequestHead two = get("localhost");
  two.host_count = 2;
  EXPECT_EQ(status_of(check_request(two, p)), 400);
}

TEST(HttpGuard, HostOfAnExposedServer) {
  AccessPolicy p;
  p.bound_host = "0.0.0.0";
  EXPECT_EQ(status_of(check_request(get("192.168.1.5:8080"), p)), 0);  // the operator exposed it
  p.allowed_hosts = {"hearth.lan"};
  EXPECT_EQ(status_of(check_request(get("192.168.1.5:8080"), p)), 403);
  EXPECT_EQ(status_of(check_request(get("hearth.lan"), p)), 0);
  p.bound_host = "192.168.1.5";
  EXPECT_EQ(status_of(check_request(get("192.168.1.5:8080"), p)), 0);  // the bound address
}

TEST(HttpGuard, OriginAndCors) {
  AccessPolicy p = loopback();
  RequestHead r = post_json("127.0.0.1:8080");
  r.has_origin = true;
  r.origin = "http://127.0.0.1:8080";
  GuardDecision d = check_request(r, p);
  EXPECT_EQ(status_of(d), 0);
  EXPECT_EQ(d.cors_origin, "");
  r.origin = "http://localhost:8080";  // another origin, even on this machine
  EXPECT_EQ(status_of(check_request(r, p)), 403);
  r.origin = "null";
  EXPECT_EQ(status_of(check_request(r, p)), 403);
  r.origin = "http://app.example";
  EXPECT_EQ(status_of(check_request(r, p)), 403);
  p.allowed_origins = {"http://app.example"};
  d = check_request(r, p);
  EXPECT_EQ(status_of(d), 0);
  EXPECT_EQ(d.cors_origin, "http://app.example");
  EXPECT_FALSE(d.preflight);
  RequestHead pre = get("127.0.0.1:8080");
  pre.method = "OPTIONS";
  pre.has_origin = true;
  pre.origin = "http://app.example";
  d = check_request(pre, p);
  EXPECT_TRUE(d.preflight);
  // Default ports: an origin without a port is port 80 (http) / 443 (https).
  p.allowed_origins.clear();
  RequestHead same = get("localhost");
  same.has_origin = true;
  same.origin = "http://localhost";
  EXPECT_EQ(status_of(check_request(same, p)), 0);
  same.origin = "https://localhost";
  EXPECT_EQ(status_of(check_request(same, p)), 403);
}

TEST(HttpGuard, BearerKey) {
  AccessPolicy p = loopback();
  p.api_key = "k3y";
  RequestHead r = get("localhost");
  for (const char* ok : {"Bearer k3y", "bearer k3y", "BEARER    k3y", "  Bearer k3y  "}) {
    r.authorization = ok;
    EXPECT_EQ(status_of(check_request(r, p)), 0) << ok;
  }
  for (const char* bad : {"", "Bearer", "Bearer ", "Bearerk3y", "Basic k3y", "Bearer k3y2", "Bearer K3Y"}) {
    r.authorization = bad;
    GuardDecision d = check_request(r, p);
    EXPECT_EQ(status_of(d), 401) << bad;
    EXPECT_EQ(d.refusal->code, "invalid_api_key");
  }
  r.path = "/health";  // outside /v1/
  r.authorization = "";
  EXPECT_EQ(status_of(check_request(r, p)), 0);
}

TEST(HttpGuard, AnthropicXApiKey) {
  AccessPolicy p = loopback();
  p.api_key = "k3y";
  RequestHead r = get("localhost");
  r.path = "/v1/messages";
  r.x_api_key = "k3y";
  EXPECT_EQ(status_of(check_request(r, p)), 0);
  r.x_api_key = " k3y ";
  EXPECT_EQ(status_of(check_request(r, p)), 0);
  for (const char* bad : {"K3Y", "k3y2", "Bearer k3y"}) {
    r.x_api_key = bad;
    GuardDecision d = check_request(r, p);
    EXPECT_EQ(status_of(d), 401) << bad;
    EXPECT_EQ(d.refusal->message, "Incorrect API key provided.");
  }
  // Either header may carry the key: a wrong one beside a right one is still let through.
  r.x_api_key = "wrong";
  r.authorization = "Bearer k3y";
  EXPECT_EQ(status_of(check_request(r, p)), 0);
  r.authorization = "";
  r.x_api_key = "";
  EXPECT_NE(check_request(r, p).refusal->message.find("x-api-key"), std::string::npos);
  r.path = "/metrics";  // outside /v1/, like /health
  EXPECT_EQ(status_of(check_request(r, p)), 0);
}

TEST(HttpGuard, FramingAndContentType) {
  AccessPolicy p = loopback();
  p.max_body_bytes = 1000;
  GuardDecision d = check_request(post_json("localhost", "10"), p);
  EXPECT_EQ(status_of(d), 0);
  EXPECT_TRUE(d.has_body);
  EXPECT_FALSE(check_request(post_json("localhost", "0"), p).has_body);
  for (const char* bad : {"-1", "", "1e3", "0x10", "12 13", "99999999999999999999"})
    EXPECT_EQ(status_of(check_request(post_json("localhost", bad), p)), 400) << bad;
  EXPECT_EQ(status_of(check_request(post_json("localhost", "1001"), p)), 413);
  RequestHead two = post_json("localhost");
  two.content_length_count = 2;
  EXPECT_EQ(status_of(check_request(two, p)), 400);
  RequestHead chunked = post_json("localhost");
  chunked.content_length_count = 0;
  chunked.transfer_encoding = "Chunked";
  chunked.transfer_encoding_count = 1;
  d = check_request(chunked, p);
  EXPECT_EQ(status_of(d), 0);
  EXPECT_TRUE(d.has_body);
  chunked.transfer_encoding = "gzip, chunked";
  EXPECT_EQ(status_of(check_request(chunked, p)), 501);
  chunked.transfer_encoding = "chunked";
  chunked.content_length_count = 1;  // both: smuggling bait
  EXPECT_EQ(status_of(check_request(chunked, p)), 400);
  for (const char* type : {"text/plain", "", "application/jsonx", "application/x-www-form-urlencoded"}) {
    RequestHead r = post_json("localhost");
    r.content_type = type;
    d = check_request(r, p);
    EXPECT_EQ(status_of(d), 415) << type;
    EXPECT_EQ(d.refusal->code, "unsupported_media_type");
  }
  RequestHead r = post_json("localhost");
  r.content_type = " Application/JSON ; charset=UTF-8";
  EXPECT_EQ(status_of(check_request(r, p)), 0);
}

TEST(HttpGuard, HostIsCheckedFirst) {
  // A foreign page learns nothing else (not even whether a key is needed) from its answers.
  AccessPolicy p = loopback();
  p.api_key = "k";
  RequestHead r = post_json("attacker.example");
  r.content_type = "text/plain";
  r.has_origin = true;
  r.origin = "http://attacker.example";
  EXPECT_EQ(check_request(r, p).refusal->code, "host_not_allowed");
  r.host = "localhost";
  EXPECT_EQ(check_request(r, p).refusal->code, "origin_not_allowed");
  r.has_origin = false;
  EXPECT_EQ(check_request(r, p).refusal->code, "invalid_api_key");
  r.authorization = "Bearer k";
  EXPECT_EQ(check_request(r, p).refusal->code, "unsupported_media_type");
}

}  // namespace
}  // namespace hearth::server
