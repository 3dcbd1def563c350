// The request's `model` on every generation route, as vLLM: absent or the served id is served,
// a mounted adapter id selects that adapter, anything else is a 404 model_not_found (in
// Anthropic's shape on /v1/messages). The served id of a model folder is the folder's name however
// --model spells it (trailing slashes, ".", "./x/").
#include <unistd.h>

#include "../adapters/lora_test_util.h"
#include "server/model_engine.h"
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

// `engine` behind a Server on an ephemeral loopback port while this lives.
class ServedForModelTest {
 public:
  explicit ServedForModelTest(Engine& engine) : server_(engine, options()), port_(server_.bind()) {
    thread_ = std::thread([this] { server_.serve(); });
  }
  ~ServedForModelTest() {
    server_.stop();
    thread_.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    return c;
  }

 private:
  static ServerOptions options() {
    ServerOptions o;
    o.port = 0;
    return o;
  }
  Server server_;
  int port_;
  std::thread thread_;
};

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
  ServedForModelTest served(engine);
  httplib::Client c = served.client();
  auto chat = [&](const std::string& fields) {
    return c.Post("/v1/chat/completions", "{" + fields + R"(, "messages": [{"role": "user", "content": "hi"}]})",
                  "application/json");
  };
  auto r = chat(R"("model": "sql")");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(J::parse(r->body)["model"], "sql");
  EXPECT_EQ(engine.seen, "sql");
  // An explicit `adapter` decides if it includes the adapter the model names (else the response
  // would name one and run another: a 400); the served id leaves the default.
  EXPECT_EQ(chat(R"("model": "sql", "adapter": "chunk+sql")")->status, 200);
  EXPECT_EQ(engine.seen, "chunk+sql");
  EXPECT_EQ(chat(R"("model": "sql", "adapter": "chunk,sql")")->status, 200);  // the other separator
  EXPECT_EQ(chat(R"("model": "sql", "adapter": "sql++chunk")")->status, 400);
  auto conflict = chat(R"("model": "sql", "adapter": "none")");
  EXPECT_EQ(conflict->status, 400) << conflict->body;
  EXPECT_EQ(J::parse(conflict->body)["error"]["param"], "adapter");
  EXPECT_EQ(chat(R"("model": "sql", "adapter": "sql2")")->status, 400);
  EXPECT_EQ(chat(R"("model": "fake-model")")->status, 200);
  EXPECT_EQ(engine.seen, "<unset>");
  EXPECT_EQ(chat(R"("model": "sql2")")->status, 404);
}

TEST(ServerModelId, TheServedIdIsTheFolderNameHoweverThePathIsSpelled) {
  namespace fs = std::filesystem;
  hearth::testing::TempDir d;
  const fs::path dir = d.path() / "tiny-model";
  fs::copy(hearth::testing::golden_model("llama_mha"), dir, fs::copy_options::recursive);
  auto options = [](const std::string& spelled) {
    ModelEngineOptions o;
    o.model_dir = spelled;
    o.device = "cpu";
    o.dtype = "float32";
    return o;
  };
  auto id_of = [&](const std::string& spelled) { return ModelEngine(options(spelled)).model_id(); };
  const std::string rel = fs::relative(dir, fs::current_path()).string();
  for (const std::string& spelled :
       {dir.string(), dir.string() + "/", dir.string() + "//", dir.string() + "/.", rel + "/", "./" + rel + "/"})
    EXPECT_EQ(id_of(spelled), "tiny-model") << spelled;
  const fs::path cwd = fs::current_path();
  ASSERT_EQ(::chdir(dir.c_str()), 0);
  std::string dot, dot_slash;
  try {
    dot = id_of(".");
    dot_slash = id_of("./");
  } catch (...) {
    (void)::chdir(cwd.c_str());
    throw;
  }
  ASSERT_EQ(::chdir(cwd.c_str()), 0);
  EXPECT_EQ(dot, "tiny-model");
  EXPECT_EQ(dot_slash, "tiny-model");

  // Through the server: /v1/models lists the folder's name, and a request naming it is served.
  ModelEngine engine(options(dir.string() + "/"));
  ServedForModelTest served(engine);
  httplib::Client c = served.client();
  auto models = c.Get("/v1/models");
  auto done = c.Post("/v1/completions", R"({"model": "tiny-model", "prompt": "hi", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(models);
  EXPECT_EQ(J::parse(models->body)["data"][0]["id"], "tiny-model") << models->body;
  ASSERT_TRUE(done);
  EXPECT_EQ(done->status, 200) << done->body;
  EXPECT_EQ(J::parse(done->body)["model"], "tiny-model") << done->body;
}

}  // namespace
}  // namespace hearth::server
