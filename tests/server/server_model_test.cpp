// The request's `model` on every generation route, as vLLM: absent or the served id is served,
// a mounted adapter id selects that adapter, anything else is a 404 model_not_found (in
// Anthropic's shape on /v1/messages).
#include "server_test_util.h"

namespace hearth::server {
namespace {

using namespace hearth::server::testing;

TEST_F(ServerTest, UnknownModelIsA404OnEveryGenerationRoute) {
  start();
  const std::string messages = R"("messages": [{"role": "user", "content": "hi"}])";
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/chat/completions", R"({"model": "gpt-4o", )" + messages + "}"},
           {"/v1/completions", R"({"model": "gpt-4o", "prompt": "hi"})"},
           {"/v1/responses", R"({"model": "gpt-4o", "input": "hi"})"}}) {
    auto r = post(path, body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404) << path;
    EXPECT_EQ(J::parse(r->body), J::parse(R"({"error": {"message": "The model `gpt-4o` does not exist.",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}})")) << path;
  }
  for (const char* path : {"/v1/messages", "/v1/messages/count_tokens"}) {
    auto r = post(path, R"({"model": "claude-x", "max_tokens": 5, )" + messages + "}");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404) << path;
    EXPECT_EQ(J::parse(r->body), J::parse(R"({"type": "error", "error": {"type": "not_found_error",
        "message": "The model `claude-x` does not exist."}})")) << path;
  }
  EXPECT_EQ(engine_->prepares(), 0);
  // Absent, empty and the served id are served.
  EXPECT_EQ(post("/v1/chat/completions", "{" + messages + "}")->status, 200);
  EXPECT_EQ(post("/v1/chat/completions", R"({"model": "", )" + messages + "}")->status, 200);
  EXPECT_EQ(post("/v1/chat/completions", R"({"model": "fake-model", )" + messages + "}")->status, 200);
  EXPECT_EQ(post("/v1/messages", R"({"model": "fake-model", "max_tokens": 5, )" + messages + "}")->status, 200);
}

// A FakeEngine with one mounted adapter "sql" that records the adapter each prompt was built for.
class AdapterFake : public FakeEngine {
 public:
  std::vector<AdapterInfo> list_adapters() const override { return {AdapterInfo{"sql", "/a/sql", "peft", 8, 4, 2.0}}; }
  Prompt prepare(const CompletionRequest& req) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      seen = req.adapter.value_or("<unset>");
    }
    CompletionRequest base = req;
    base.adapter.reset();
    return FakeEngine::prepare(base);
  }
  std::mutex mu;
  std::string seen;
};

TEST(ServerModel, AnAdapterIdAsModelSelectsThatAdapter) {
  AdapterFake engine;
  ServerOptions o;
  o.port = 0;
  Server server(engine, o);
  const int port = server.bind();
  std::thread t([&] { server.serve(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10, 0);
  auto chat = [&](const std::string& fields) {
    return c.Post("/v1/chat/completions", "{" + fields + R"(, "messages": [{"role": "user", "content": "hi"}]})",
                  "application/json");
  };
  auto r = chat(R"("model": "sql")");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(J::parse(r->body)["model"], "sql");
  EXPECT_EQ(engine.seen, "sql");
  // An explicit `adapter` wins over the model name; the served id leaves the default.
  EXPECT_EQ(chat(R"("model": "sql", "adapter": "none")")->status, 200);
  EXPECT_EQ(engine.seen, "none");
  EXPECT_EQ(chat(R"("model": "fake-model")")->status, 200);
  EXPECT_EQ(engine.seen, "<unset>");
  EXPECT_EQ(chat(R"("model": "sql2")")->status, 404);
  server.stop();
  t.join();
}

}  // namespace
}  // namespace hearth::server
