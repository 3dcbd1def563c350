// Who may drive the server, in process (FakeEngine): cross-site pages (Origin, text/plain POSTs),
// DNS rebinding (Host), CORS only when configured, the Bearer scheme in any case, and the web
// chat's own same-origin requests.
#include "server_test_util.h"

namespace hearth::server {
namespace {

using namespace hearth::server::testing;

class AccessTest : public ServerTest {
 protected:
  std::string self() const { return "127.0.0.1:" + std::to_string(port_); }
};

TEST_F(AccessTest, CrossSitePostsNeverReachTheEngine) {
  start();
  // What a page on attacker.example can send without a CORS preflight: a text/plain POST.
  auto r = client().Post("/v1/chat/completions", {{"Origin", "http://attacker.example"}}, chat_body("hi"), "text/plain");
  expect_error(r, 403, "", "origin_not_allowed");
  EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
  r = client().Post("/v1/adapters", {{"Origin", "https://attacker.example"}}, R"({"id": "a", "path": "/tmp"})",
                    "application/json");
  expect_error(r, 403, "", "origin_not_allowed");
  // Without an Origin (a form or a non-browser client), a body that is not declared JSON: 415.
  for (const char* type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"}) {
    r = client().Post("/v1/chat/completions", chat_body("hi"), type);
    expect_error(r, 415, "", "unsupported_media_type");
  }
  EXPECT_EQ(engine_->prepares(), 0);
  EXPECT_EQ(engine_->generations(), 0);
  // JSON with parameters is JSON.
  EXPECT_EQ(client().Post("/v1/chat/completions", chat_body("hi"), "application/json; charset=utf-8")->status, 200);
}

TEST_F(AccessTest, ForeignHostNamesAreRefusedOnALoopbackServer) {
  start();
  // DNS rebinding: attacker.example now resolves to 127.0.0.1, and the browser sends its name.
  auto r = client().Get("/v1/models", {{"Host", "attacker.example:" + std::to_string(port_)}});
  expect_error(r, 403, "", "host_not_allowed");
  expect_error(post("/v1/chat/completions", chat_body("hi"), {{"Host", "attacker.example"}}), 403, "", "host_not_allowed");
  for (std::string host : {self(), "localhost:" + std::to_string(port_), std::string("LOCALHOST"), std::string("[::1]:80"),
                           std::string("127.0.0.2"), std::string("app.localhost")})
    EXPECT_EQ(client().Get("/health", {{"Host", host}})->status, 200) << host;
  EXPECT_EQ(engine_->generations(), 0);
}

TEST_F(AccessTest, AllowedHostsExtendTheList) {
  ServerOptions o;
  o.allowed_hosts = {"hearth.lan"};
  start(o);
  EXPECT_EQ(client().Get("/health", {{"Host", "hearth.lan:8080"}})->status, 200);
  EXPECT_EQ(client().Get("/health", {{"Host", self()}})->status, 200);
  expect_error(client().Get("/health", {{"Host", "other.lan"}}), 403, "", "host_not_allowed");
  o.allowed_hosts = {"*"};
  TearDown();
  start(o);
  EXPECT_EQ(client().Get("/health", {{"Host", "anything.example"}})->status, 200);
}

TEST_F(AccessTest, TheWebChatsSameOriginRequestsWork) {
  start();
  const std::string origin = "http://" + self();
  auto r = post("/v1/chat/completions", chat_body("from the page"), {{"Origin", origin}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));  // same origin needs none
  EXPECT_EQ(client().Get("/v1/models", {{"Origin", origin}})->status, 200);
  // Another port on the same host is another origin.
  expect_error(post("/v1/chat/completions", chat_body("x"), {{"Origin", "http://127.0.0.1:1"}}), 403, "",
               "origin_not_allowed");
}

TEST_F(AccessTest, CorsHeadersOnlyForConfiguredOrigins) {
  ServerOptions o;
  o.allowed_origins = {"http://app.example:3000"};
  start(o);
  auto r = post("/v1/chat/completions", chat_body("hi"), {{"Origin", "http://app.example:3000"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://app.example:3000");
  EXPECT_EQ(r->get_header_value("Vary"), "Origin");
  httplib::Headers pre = {{"Origin", "http://app.example:3000"},
                          {"Access-Control-Request-Method", "POST"},
                          {"Access-Control-Request-Headers", "authorization, content-type"}};
  auto p = client().Options("/v1/chat/completions", pre);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, 204);
  EXPECT_EQ(p->get_header_value("Access-Control-Allow-Origin"), "http://app.example:3000");
  EXPECT_NE(p->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_EQ(p->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
  expect_error(post("/v1/chat/completions", chat_body("hi"), {{"Origin", "http://evil.example"}}), 403, "",
               "origin_not_allowed");
  // "*": any origin, answered with "*".
  o.allowed_origins = {"*"};
  TearDown();
  start(o);
  r = post("/v1/chat/completions", chat_body("hi"), {{"Origin", "http://anywhere.example"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "*");
}

TEST_F(AccessTest, NoCorsPreflightWithoutConfiguration) {
  start();
  auto p = client().Options("/v1/chat/completions",
                            {{"Origin", "http://app.example"}, {"Access-Control-Request-Method", "POST"}});
  expect_error(p, 403, "", "origin_not_allowed");
  EXPECT_FALSE(p->has_header("Access-Control-Allow-Origin"));
}

TEST_F(AccessTest, BearerSchemeIsCaseInsensitive) {
  ServerOptions o;
  o.api_key = "s3cret";
  start(o);
  for (const char* auth : {"Bearer s3cret", "bearer s3cret", "BEARER   s3cret", "bEaReR s3cret "})
    EXPECT_EQ(post("/v1/chat/completions", chat_body("x"), {{"Authorization", auth}})->status, 200) << auth;
  for (const char* auth : {"Basic s3cret", "Bearers3cret", "Bearer S3CRET", "s3cret"}) {
    auto r = post("/v1/chat/completions", chat_body("x"), {{"Authorization", auth}});
    expect_error(r, 401, "", "invalid_api_key");
    EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer") << auth;
  }
}

}  // namespace
}  // namespace hearth::server
