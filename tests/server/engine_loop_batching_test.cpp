// EngineLoop's continuous batching with the real ModelEngine (tiny golden llama, CPU fp32):
// requests submitted together run together (up to max_num_seqs), each answer equals the answer it
// gets alone, a request with an adapter batches beside base-model ones, a cancelled request ends
// with "abort" without disturbing the others, and an adapter mount waits for the running batch.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "../adapters/lora_test_util.h"
#include "engine_job_test_util.h"
#include "server/engine_loop.h"
#include "server/model_engine.h"

namespace hearth::server {
namespace {

using namespace std::chrono_literals;
using hearth::testing::golden_lora;
using hearth::testing::golden_model;

using Answer = hearth::server::testing::JobAnswer;
using hearth::server::testing::greedy_text_request;
Answer collect(Job& job) { return hearth::server::testing::collect_job(job); }
CompletionRequest text_request(const std::string& prompt, int64_t max_tokens, std::optional<std::string> adapter = {}) {
  return greedy_text_request(prompt, max_tokens, std::move(adapter));
}

std::unique_ptr<ModelEngine> engine_with_adapter() {
  ModelEngineOptions o;
  o.model_dir = golden_model("llama_gqa_tied");
  o.device = "cpu";
  o.dtype = "float32";
  o.prompt_cache_bytes = 0;  // each answer computed from scratch, alone or batched
  o.adapters.emplace_back("ad", golden_lora("llama_gqa_tied"));
  return std::make_unique<ModelEngine>(std::move(o));
}

const std::vector<std::string> kPrompts{"Hello", "The quick brown fox jumps", "a b c d e f g h i j k l m n o p",
                                        "Once upon a time", "1 2 3", "zebra"};

TEST(EngineLoopBatching, RequestsRunTogetherAndAnswerAsTheyDoAlone) {
  auto engine = engine_with_adapter();
  ASSERT_TRUE(engine->supports_batching());
  auto request = [&](size_t i) {
    return text_request(kPrompts[i], 10 + static_cast<int64_t>(i), i % 3 == 1 ? std::optional<std::string>("ad") : std::nullopt);
  };
  std::vector<Answer> alone;
  {
    EngineLoopOptions o;
    o.max_num_seqs = 1;
    EngineLoop loop(*engine, o);
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      auto job = loop.submit(request(i));
      ASSERT_TRUE(job);
      alone.push_back(collect(*job));
    }
  }
  EngineLoopOptions o;
  o.max_num_seqs = 4;
  EngineLoop loop(*engine, o);
  std::atomic<bool> watching{true};
  std::atomic<size_t> most{0};
  std::thread watcher([&] {
    while (watching) {
      most = std::max(most.load(), loop.running());
      std::this_thread::sleep_for(1ms);
    }
  });
  std::vector<std::shared_ptr<Job>> jobs;
  for (size_t i = 0; i < kPrompts.size(); ++i) jobs.push_back(loop.submit(request(i)));
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_TRUE(jobs[i]);
    Answer a = collect(*jobs[i]);
    EXPECT_EQ(a.text, alone[i].text) << "request " << i;
    EXPECT_EQ(a.finish, alone[i].finish) << "request " << i;
    EXPECT_EQ(a.tokens, alone[i].tokens) << "request " << i;
  }
  watching = false;
  watcher.join();
  EXPECT_GE(most.load(), 2u);  // they were generated together
  EXPECT_LE(most.load(), 4u);  // never more than max_num_seqs
  // The adapter changes its requests' answers (else the mix above proves nothing).
  EngineLoop base_loop(*engine, EngineLoopOptions{});
  Answer base = collect(*base_loop.submit(text_request(kPrompts[1], 11)));
  EXPECT_NE(base.text, alone[1].text);
}

TEST(EngineLoopBatching, ACancelledRequestAbortsAloneAndATaskWaitsForTheBatch) {
  auto engine = engine_with_adapter();
  EngineLoopOptions o;
  o.max_num_seqs = 4;
  EngineLoop loop(*engine, o);
  Answer want = [&] {
    EngineLoop solo(*engine, EngineLoopOptions{});
    return collect(*solo.submit(text_request(kPrompts[2], 40)));
  }();
  auto keep = loop.submit(text_request(kPrompts[2], 40));
  auto drop = loop.submit(text_request(kPrompts[3], 40));
  std::atomic<bool> task_ran{false};
  std::atomic<size_t> running_at_task{99};
  auto task = loop.submit_task([&] {
    running_at_task = loop.running();
    task_ran = true;
  });
  ASSERT_TRUE(keep && drop && task);
  // Cancel once the dropped request has produced something.
  for (;;) {
    auto ev = drop->events.pop(50ms);
    if (ev && ev->kind == StreamEvent::Kind::kDelta) break;
  }
  drop->cancelled = true;
  Answer d = collect(*drop);
  EXPECT_EQ(d.finish, "abort");
  Answer k = collect(*keep);
  EXPECT_EQ(k.text, want.text);
  EXPECT_EQ(k.finish, want.finish);
  auto done = task->events.pop(10s);
  ASSERT_TRUE(done);
  EXPECT_EQ(done->kind, StreamEvent::Kind::kDone);
  EXPECT_TRUE(task_ran);
  EXPECT_EQ(running_at_task.load(), 0u);
}

TEST(EngineLoopBatching, TheMemoryBudgetQueuesWhatDoesNotFitAndRefusesWhatNeverCan) {
  auto engine = engine_with_adapter();
  const int64_t one = engine->state_bytes(40);  // KV grows in 256-token steps: any request here
  ASSERT_GT(one, 0);
  EXPECT_GT(engine->state_bytes(600), one);  // KV grows with the tokens
  EngineLoopOptions o;
  o.max_num_seqs = 4;
  o.memory_budget = one + one / 2;  // one request fits, two do not
  EngineLoop loop(*engine, o);
  std::atomic<bool> watching{true};
  std::atomic<size_t> most{0};
  std::thread watcher([&] {
    while (watching) {
      most = std::max(most.load(), loop.running());
      EXPECT_LE(loop.reserved_bytes(), o.memory_budget);
      std::this_thread::sleep_for(1ms);
    }
  });
  auto a = loop.submit(text_request(kPrompts[0], 30));
  auto b = loop.submit(text_request(kPrompts[1], 30));
  ASSERT_TRUE(a && b);
  EXPECT_NE(collect(*a).finish.rfind("error", 0), 0u);
  EXPECT_NE(collect(*b).finish.rfind("error", 0), 0u);
  watching = false;
  watcher.join();
  EXPECT_EQ(most.load(), 1u);  // the second waited for the first
  EXPECT_EQ(loop.reserved_bytes(), 0);
  // A request that could never fit is refused at once, naming the limit.
  EngineLoopOptions tight = o;
  tight.memory_budget = one / 2;
  EngineLoop small(*engine, tight);
  auto big = small.submit(text_request(kPrompts[0], 30));
  ASSERT_TRUE(big);
  auto ev = big->events.pop(1s);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, StreamEvent::Kind::kError);
  EXPECT_EQ(ev->status, 400);
  EXPECT_EQ(ev->code, "memory_budget_exceeded");
  EXPECT_EQ(ev->param, "max_tokens");
}

// A queued request whose client left is dropped at once (499), so a request behind it that fits the
// budget next to the running one starts now instead of waiting for the running one to end (an
// attack found the abandoned head holding the queue for the whole of the running request).
TEST(EngineLoopBatching, AQueuedRequestWhoseClientLeftDoesNotHoldUpTheQueue) {
  auto engine = engine_with_adapter();
  const int64_t one = engine->state_bytes(40);  // every request here charges one 256-token step
  EngineLoopOptions o;
  o.max_num_seqs = 4;
  o.memory_budget = 2 * one;  // a and c fit together; a and b (two choices) do not
  EngineLoop loop(*engine, o);
  auto a = loop.submit(text_request(kPrompts[0], 200));
  CompletionRequest two = text_request(kPrompts[1], 30);
  two.n = 2;
  auto b = loop.submit(two);  // waits for a: its two choices need the whole budget
  ASSERT_TRUE(a && b);
  b->cancelled = true;                                  // its client leaves while it waits
  auto c = loop.submit(text_request(kPrompts[2], 5));  // fits beside a
  ASSERT_TRUE(c);
  // Which of a and c ends first says whether c ran beside a (5 steps against a's 200) or waited
  // for it behind b; unlike sampling running(), this does not depend on a watcher thread being
  // scheduled during c's few milliseconds (a loaded CI machine missed that window).
  using Clock = std::chrono::steady_clock;
  Answer answer_a, answer_c;
  Clock::time_point end_a, end_c;
  std::thread wait_a([&] {
    answer_a = collect(*a);
    end_a = Clock::now();
  });
  std::thread wait_c([&] {
    answer_c = collect(*c);
    end_c = Clock::now();
  });
  EXPECT_EQ(collect(*b).finish.rfind("error 499", 0), 0u);
  wait_a.join();
  wait_c.join();
  EXPECT_EQ(answer_c.finish.rfind("error", 0), std::string::npos);
  EXPECT_EQ(answer_a.finish, "length");  // a really ran its 200 steps
  EXPECT_EQ(answer_a.tokens, 200);
  EXPECT_LT(end_c, end_a);  // c ran beside a (with b holding the queue it would have waited for a)
}

TEST(EngineLoopBatching, TheMemoryChargeIsSpelledOutAndADefaultedMaxTokensSaysSo) {
  auto engine = engine_with_adapter();
  const Engine::StateCharge c = engine->state_charge();
  ASSERT_GT(c.per_token, 0);
  EXPECT_EQ(c.round_to, 256);
  // state_bytes is exactly the terms state_charge reports.
  for (int64_t t : {1, 40, 256, 257, 600})
    EXPECT_EQ(engine->state_bytes(t), c.fixed + c.per_token * ((t + 255) / 256 * 256)) << t;
  EngineLoopOptions o;
  o.max_num_seqs = 4;
  o.memory_budget = engine->state_bytes(40) / 2;  // nothing fits
  o.default_max_tokens_completion = 0;             // no max_tokens: fill the context
  EngineLoop loop(*engine, o);
  CompletionRequest no_limit = text_request(kPrompts[0], 1);
  no_limit.max_tokens.reset();
  auto job = loop.submit(no_limit);
  ASSERT_TRUE(job);
  auto ev = job->events.pop(1s);
  ASSERT_TRUE(ev);
  ASSERT_EQ(ev->kind, StreamEvent::Kind::kError);
  EXPECT_EQ(ev->code, "memory_budget_exceeded");
  const int64_t ctx = engine->context_length();
  const std::string& m = ev->message;
  EXPECT_NE(m.find(std::to_string(engine->state_bytes(ctx)) + " bytes"), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(c.per_token) + " bytes per token x " + std::to_string((ctx + 255) / 256 * 256) + " tokens"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("prompt + max_tokens = " + std::to_string(ctx)), std::string::npos) << m;
  EXPECT_NE(m.find("set no max_tokens"), std::string::npos) << m;
  EXPECT_NE(m.find("all the room left in the context"), std::string::npos) << m;
  // With a max_tokens of its own, nothing is said about a default.
  auto own = loop.submit(text_request(kPrompts[0], 30));
  ASSERT_TRUE(own);
  auto ev2 = own->events.pop(1s);
  ASSERT_TRUE(ev2);
  EXPECT_EQ(ev2->message.find("set no max_tokens"), std::string::npos) << ev2->message;
  EXPECT_NE(ev2->message.find("rounded up to the caches' 256-token growth step"), std::string::npos) << ev2->message;
}

}  // namespace
}  // namespace hearth::server
