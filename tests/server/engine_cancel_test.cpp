// A request whose client leaves during a long prefill, through the EngineLoop and a real ModelEngine
// (tiny golden llama, CPU fp32, 4-token prefill chunks): it is dropped at the next chunk boundary —
// two chunks of its fifty run, not all of them — answered "abort" without a token, its budget
// freed, and the next request runs; batched and one at a time; and over HTTP, a streaming client
// that closes its socket while nothing is written to it. Deterministic: a wrapping engine holds the
// loop at a chosen step while the client leaves; chunks are counted, not timed.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <semaphore>
#include <thread>

#include "../adapters/lora_test_util.h"
#include "engine_job_test_util.h"
#include "server/engine_loop.h"
#include "server/model_engine.h"
#include "server/server.h"

namespace hearth::server {
namespace {

// Delegates to a ModelEngine; its step number `hold_at` waits for the test (reached, then go).
class GatedEngine : public Engine {
 public:
  GatedEngine(ModelEngine& inner, int hold_at) : inner_(inner), hold_at_(hold_at) {}
  std::string model_id() const override { return inner_.model_id(); }
  int64_t context_length() const override { return inner_.context_length(); }
  int64_t max_token_bytes() const override { return inner_.max_token_bytes(); }
  Prompt prepare(const CompletionRequest& req) override { return inner_.prepare(req); }
  void check_request(const CompletionRequest& req) override { inner_.check_request(req); }
  Finish generate(const Prompt& prompt, const CompletionRequest& req, const TokenCallback& on_token) override {
    std::unique_ptr<ActiveSequence> s = start_sequence(prompt, req, on_token);  // ModelEngine::generate, gated
    while (!s->done()) step({s.get()});
    return finish_sequence(*s);
  }
  bool supports_batching() const override { return true; }
  int64_t state_bytes(int64_t tokens) const override { return inner_.state_bytes(tokens); }
  StateCharge state_charge() const override { return inner_.state_charge(); }
  std::unique_ptr<ActiveSequence> start_sequence(const Prompt& prompt, const CompletionRequest& req,
                                                 TokenCallback on_token) override {
    return inner_.start_sequence(prompt, req, std::move(on_token));
  }
  std::vector<std::unique_ptr<ActiveSequence>> start_sequences(const Prompt& prompt, const CompletionRequest& req,
                                                               std::vector<TokenCallback> on_tokens) override {
    return inner_.start_sequences(prompt, req, std::move(on_tokens));
  }
  void step(const std::vector<ActiveSequence*>& seqs) override {
    if (++steps_ == hold_at_) {
      reached.release();
      go.acquire();
    }
    inner_.step(seqs);
  }
  Finish finish_sequence(ActiveSequence& seq) override {
    Finish f = inner_.finish_sequence(seq);
    ++finishes_;
    return f;
  }
  int steps() const { return steps_; }
  int finishes() const { return finishes_; }  ///< finish_sequence calls that returned

  std::binary_semaphore reached{0}, go{0};

 private:
  ModelEngine& inner_;
  int hold_at_;
  std::atomic<int> steps_{0}, finishes_{0};
};

ModelEngineOptions cancel_engine_options() {
  ModelEngineOptions o;
  o.model_dir = hearth::testing::golden_model("llama_gqa_tied");
  o.device = "cpu";
  o.dtype = "float32";
  o.prompt_cache_bytes = 0;
  o.prefill_step_size = 4;  // the 200-token prompt is 50 chunks, one per step
  return o;
}

std::vector<int64_t> cancel_prompt_ids() {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 200; ++i) ids.push_back((i * 37 + 11) % 500);
  return ids;
}

TEST(EngineCancel, AClientLeavingDuringALongPrefillIsDroppedAtTheNextChunk) {
  ModelEngine inner(cancel_engine_options());
  for (size_t max_num_seqs : {4u, 1u}) {
    SCOPED_TRACE(max_num_seqs == 1 ? "one at a time" : "batched");
    GatedEngine engine(inner, /*hold_at=*/3);
    EngineLoopOptions lo;
    lo.max_num_seqs = max_num_seqs;
    lo.memory_budget = inner.state_bytes(inner.context_length()) * 4;
    EngineLoop loop(engine, lo);
    CompletionRequest req = testing::greedy_text_request("", 5);
    req.prompt_ids = cancel_prompt_ids();
    auto job = loop.submit(req);
    ASSERT_TRUE(job);
    engine.reached.acquire();  // two chunks in, the third step about to run
    job->cancelled = true;     // what the HTTP side does when the client's socket closes
    engine.go.release();
    const testing::JobAnswer a = testing::collect_job(*job);
    EXPECT_EQ(a.finish, "abort");
    EXPECT_EQ(a.tokens, 0);
    EXPECT_EQ(a.text, "");
    EXPECT_TRUE(inner.last_stats().cancelled);
    EXPECT_EQ(inner.last_stats().prefill_chunks, 2);  // of 50
    EXPECT_EQ(engine.steps(), 3);
    EXPECT_EQ(loop.reserved_bytes(), 0);  // given back before its client heard it was done
    // The engine is free at once for the next request, which runs in full.
    auto next = loop.submit(testing::greedy_text_request("hello there", 3));
    ASSERT_TRUE(next);
    const testing::JobAnswer b = testing::collect_job(*next);
    EXPECT_EQ(b.finish, "length");
    EXPECT_EQ(b.tokens, 3);
    EXPECT_FALSE(inner.last_stats().cancelled);
  }
}

// Over HTTP: a streamed completion prefilling a long prompt has nothing written to it (completions
// have no first chunk), so only a look at its socket shows that its client left.
TEST(EngineCancel, AStreamingClientLeavingDuringALongPrefillOverHttpIsDroppedAtTheNextChunk) {
  ModelEngine inner(cancel_engine_options());
  GatedEngine engine(inner, /*hold_at=*/3);
  ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  Server server(engine, so);
  const int port = server.bind();
  std::thread serving([&] { server.serve(); });
  nlohmann::json body = {{"prompt", cancel_prompt_ids()}, {"max_tokens", 5}, {"temperature", 0}, {"stream", true}};
  const std::string text = body.dump();
  const std::string raw = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(text.size()) + "\r\n\r\n" + text;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::send(fd, raw.data(), raw.size(), 0), static_cast<ssize_t>(raw.size()));
  engine.reached.acquire();  // two chunks in, the third step about to run
  ::close(fd);
  // The server notices while the engine is held (it used to wait for a write: a keep-alive
  // comment after 5 s, or the first token after the whole prefill).
  httplib::Client client("127.0.0.1", port);
  auto disconnects = [&] {
    auto r = client.Get("/metrics");
    const std::string key = "\nhearth_client_disconnects_total{stream=\"true\"} ";
    const size_t at = r ? r->body.find(key) : std::string::npos;
    return at == std::string::npos ? -1.0 : std::stod(r->body.substr(at + key.size()));
  };
  double seen = 0;
  for (int i = 0; i < 300 && seen < 1; ++i) {
    seen = disconnects();
    if (seen < 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(seen, 1);
  engine.go.release();
  for (int i = 0; i < 3000 && engine.finishes() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(engine.finishes(), 1);
  EXPECT_TRUE(inner.last_stats().cancelled);
  EXPECT_EQ(inner.last_stats().prefill_chunks, 2);  // of 50
  EXPECT_EQ(engine.steps(), 3);
  server.stop();
  serving.join();
}

}  // namespace
}  // namespace hearth::server
