// OpenAI `n` through EngineLoop and the real ModelEngine (tiny golden llama, CPU fp32): n choices
// share one prefill and run as n sequences of the batch; greedy choices equal the n = 1 answer,
// seeded sampled choices differ from each other and reproduce, a cancel ends all of them, and they
// count against max_num_seqs and the memory budget. HTTP shapes: choices_server_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "server/engine_loop.h"
#include "server/model_engine.h"
#include "../adapters/lora_test_util.h"

namespace hearth::server {
namespace {

using namespace std::chrono_literals;
using hearth::testing::golden_model;

CompletionRequest text_request(const std::string& prompt, int64_t max_tokens, int n, double temperature = 0.0,
                               std::optional<int64_t> seed = {}) {
  CompletionRequest r;
  r.chat = false;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.n = n;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  return r;
}

struct ChoiceAnswer {
  std::string text, finish;
  int64_t tokens = 0;
};

// Every choice's answer (by index); an error fills every unfinished choice with it.
std::vector<ChoiceAnswer> collect(Job& job, int n, Job* cancel_after_first_delta = nullptr) {
  std::vector<ChoiceAnswer> out(static_cast<size_t>(n));
  int ended = 0;
  while (ended < n) {
    auto ev = job.events.pop(50ms);
    if (!ev) continue;
    if (ev->kind == StreamEvent::Kind::kDelta) {
      out.at(static_cast<size_t>(ev->choice)).text += ev->text;
      if (cancel_after_first_delta) cancel_after_first_delta->cancelled = true;
    }
    if (ev->kind == StreamEvent::Kind::kDone) {
      ChoiceAnswer& a = out.at(static_cast<size_t>(ev->choice));
      a.finish = ev->finish_reason;
      a.tokens = ev->completion_tokens;
      ++ended;
    }
    if (ev->kind == StreamEvent::Kind::kError) {
      for (auto& a : out)
        if (a.finish.empty()) a.finish = "error " + std::to_string(ev->status) + ": " + ev->message;
      return out;
    }
  }
  return out;
}

std::unique_ptr<ModelEngine> engine(int64_t prompt_cache_bytes = 0) {
  ModelEngineOptions o;
  o.model_dir = golden_model("llama_gqa_tied");
  o.device = "cpu";
  o.dtype = "float32";
  o.prompt_cache_bytes = prompt_cache_bytes;
  return std::make_unique<ModelEngine>(std::move(o));
}

TEST(EngineLoopChoices, GreedyChoicesEqualTheSingleAnswer) {
  auto e = engine();
  ASSERT_TRUE(e->supports_batching());
  EngineLoop loop(*e, EngineLoopOptions{});
  const ChoiceAnswer one = collect(*loop.submit(text_request("The quick brown fox", 12, 1)), 1)[0];
  ASSERT_EQ(one.finish.rfind("error", 0), std::string::npos) << one.finish;
  ASSERT_FALSE(one.text.empty());
  const auto two = collect(*loop.submit(text_request("The quick brown fox", 12, 2)), 2);
  for (const ChoiceAnswer& a : two) {
    EXPECT_EQ(a.text, one.text);
    EXPECT_EQ(a.finish, one.finish);
    EXPECT_EQ(a.tokens, one.tokens);
  }
}

TEST(EngineLoopChoices, SeededSampledChoicesDifferAndReproduce) {
  auto e = engine(/*prompt_cache_bytes=*/-1);  // with the prompt cache: choice 0 may reuse a prefix
  EngineLoop loop(*e, EngineLoopOptions{});
  auto run = [&](int n) {
    return collect(*loop.submit(text_request("Once upon a time", 16, n, /*temperature=*/1.5, /*seed=*/1234)), n);
  };
  const auto a = run(3);
  const auto b = run(3);
  const auto single = run(1);
  std::set<std::string> distinct;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(a[i].text, b[i].text) << "choice " << i;  // same request + seed, same choices
    distinct.insert(a[i].text);
  }
  EXPECT_GE(distinct.size(), 2u);  // each choice samples its own stream
  EXPECT_EQ(a[0].text, single[0].text);  // choice 0 keeps the request's seed
}

TEST(EngineLoopChoices, ACancelEndsEveryChoiceAndTheyCountAsSequences) {
  auto e = engine();
  EngineLoopOptions o;
  o.max_num_seqs = 3;
  EngineLoop loop(*e, o);
  auto job = loop.submit(text_request("Hello", 200, 3));
  ASSERT_TRUE(job);
  // The three choices run as three sequences of the batch (waited for, not sampled: a loaded
  // machine can miss a 1 ms window), then the cancel ends them all.
  size_t most = 0;
  for (auto t0 = std::chrono::steady_clock::now(); most < 3 && std::chrono::steady_clock::now() - t0 < 10s;) {
    most = std::max(most, loop.running());
    std::this_thread::sleep_for(1ms);
  }
  const auto got = collect(*job, 3, job.get());
  for (const ChoiceAnswer& a : got) {
    EXPECT_EQ(a.finish, "abort");
    EXPECT_LT(a.tokens, 200);
  }
  EXPECT_EQ(most, 3u);  // three sequences of the batch
  // More choices than sequences can run: refused at once, naming n.
  auto big = loop.submit(text_request("Hello", 4, 4));
  ASSERT_TRUE(big);
  auto ev = big->events.pop(1s);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, StreamEvent::Kind::kError);
  EXPECT_EQ(ev->status, 400);
  EXPECT_EQ(ev->param, "n");
}

TEST(EngineLoopChoices, TheMemoryBudgetCountsEveryChoice) {
  auto e = engine();
  const int64_t one = e->state_bytes(40);
  EngineLoopOptions o;
  o.memory_budget = one + one / 2;  // one choice fits, two do not
  EngineLoop loop(*e, o);
  auto job = loop.submit(text_request("Hello", 20, 2));
  ASSERT_TRUE(job);
  auto ev = job->events.pop(1s);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, StreamEvent::Kind::kError);
  EXPECT_EQ(ev->code, "memory_budget_exceeded");
  EXPECT_EQ(ev->param, "n");
  const auto ok = collect(*loop.submit(text_request("Hello", 20, 1)), 1);
  EXPECT_EQ(ok[0].finish.rfind("error", 0), std::string::npos) << ok[0].finish;
  EXPECT_EQ(loop.reserved_bytes(), 0);
}

}  // namespace
}  // namespace hearth::server
