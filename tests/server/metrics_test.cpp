// GET /metrics: the Prometheus text format parsed back (HELP/TYPE lines, samples, cumulative
// histogram buckets) and checked against the requests sent; Histogram and label escaping alone.
#include <map>
#include <sstream>

#include "server/metrics.h"
#include "server_test_util.h"

namespace hearth::server {
namespace {

using namespace hearth::server::testing;

// Every sample line of an exposition text: "name{labels}" -> value. Checks that each sample's
// metric family was declared by a # TYPE line before it.
std::map<std::string, double> parse_exposition(const std::string& text) {
  std::map<std::string, double> out;
  std::map<std::string, std::string> types;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      types[name] = type;
      continue;
    }
    if (line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    EXPECT_NE(sp, std::string::npos) << line;
    const std::string key = line.substr(0, sp);
    std::string family = key.substr(0, key.find('{'));
    for (const std::string suffix : {"_bucket", "_sum", "_count"})
      if (!types.count(family) && family.ends_with(suffix)) family = family.substr(0, family.size() - suffix.size());
    EXPECT_TRUE(types.count(family)) << "no # TYPE for " << line;
    out[key] = line.substr(sp + 1) == "+Inf" ? INFINITY : std::stod(line.substr(sp + 1));
  }
  return out;
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  Metrics m;
  m.observe_ttft(0.003);   // le 0.005
  m.observe_ttft(0.005);   // le 0.005 (bounds are inclusive)
  m.observe_ttft(0.3);     // le 0.5
  m.observe_ttft(5000.0);  // only +Inf
  m.observe_ttft(-1.0);    // ignored
  m.observe_itl(0.02, 3);
  auto s = parse_exposition(m.render(2));
  EXPECT_EQ(s["hearth_time_to_first_token_seconds_bucket{le=\"0.001\"}"], 0);
  EXPECT_EQ(s["hearth_time_to_first_token_seconds_bucket{le=\"0.005\"}"], 2);
  EXPECT_EQ(s["hearth_time_to_first_token_seconds_bucket{le=\"0.25\"}"], 2);
  EXPECT_EQ(s["hearth_time_to_first_token_seconds_bucket{le=\"0.5\"}"], 3);
  EXPECT_EQ(s["hearth_time_to_first_token_seconds_bucket{le=\"2560\"}"], 3);
  EXPECT_EQ(s["hearth_time_to_first_token_seconds_bucket{le=\"+Inf\"}"], 4);
  EXPECT_EQ(s["hearth_time_to_first_token_seconds_count"], 4);
  EXPECT_DOUBLE_EQ(s["hearth_time_to_first_token_seconds_sum"], 0.003 + 0.005 + 0.3 + 5000.0);
  EXPECT_EQ(s["hearth_inter_token_latency_seconds_bucket{le=\"0.01\"}"], 0);
  EXPECT_EQ(s["hearth_inter_token_latency_seconds_bucket{le=\"0.025\"}"], 3);
  EXPECT_EQ(s["hearth_inter_token_latency_seconds_count"], 3);
  EXPECT_DOUBLE_EQ(s["hearth_inter_token_latency_seconds_sum"], 0.06);
  EXPECT_EQ(s["hearth_queue_length"], 2);
  EXPECT_EQ(s["hearth_request_duration_seconds_count"], 0);
  EXPECT_EQ(prometheus_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(Metrics, BudgetGaugesAndClientDisconnects) {
  Metrics m;
  m.count_client_disconnect(false);
  m.count_client_disconnect(false);
  m.count_client_disconnect(true);
  auto s = parse_exposition(m.render(0, CacheBudgetGauges{1000, 5000, 12, 34, 256, 56, 2055}));
  EXPECT_EQ(s["hearth_client_disconnects_total{stream=\"false\"}"], 2);
  EXPECT_EQ(s["hearth_client_disconnects_total{stream=\"true\"}"], 1);
  EXPECT_EQ(s["hearth_cache_reserved_bytes"], 1000);
  EXPECT_EQ(s["hearth_memory_budget_bytes"], 5000);
  EXPECT_EQ(s["hearth_request_charge_bytes_per_token"], 12);
  EXPECT_EQ(s["hearth_request_charge_fixed_bytes"], 34);
  EXPECT_EQ(s["hearth_request_charge_round_to_tokens"], 256);
  EXPECT_EQ(s["hearth_request_charge_window_bytes_per_token"], 56);
  EXPECT_EQ(s["hearth_request_charge_window_tokens"], 2055);
}

TEST_F(ServerTest, MetricsCountRequestsTokensAndLatencies) {
  ServerOptions o;
  o.api_key = "k";
  start(o);
  const httplib::Headers key = {{"Authorization", "Bearer k"}};
  // 2 chat requests: 4 + 5 prompt tokens, 3 + 4 generated (EOS included).
  ASSERT_EQ(post("/v1/chat/completions", chat_body("hello there"), key)->status, 200);
  ASSERT_EQ(post("/v1/chat/completions", chat_body("one two three", R"(, "stream": true)"), key)->status, 200);
  // Anthropic, streamed: 4 prompt tokens, 3 generated.
  ASSERT_EQ(post("/v1/messages", R"({"max_tokens": 9, "stream": true, "messages": [{"role": "user", "content": "a b"}]})", key)->status,
            200);
  // Responses: 3 prompt tokens ("user: a\nassistant:"), 2 generated.
  ASSERT_EQ(post("/v1/responses", R"({"input": "a"})", key)->status, 200);
  EXPECT_EQ(post("/v1/chat/completions", R"({"messages": 1})", key)->status, 400);
  EXPECT_EQ(client().Get("/v1/models")->status, 401);  // no key
  EXPECT_EQ(client().Get("/health")->status, 200);

  // /metrics, like /health, needs no key.
  auto r = client().Get("/metrics");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  auto s = parse_exposition(r->body);
  EXPECT_EQ(s["hearth_requests_total{route=\"/v1/chat/completions\",status=\"200\"}"], 2);
  EXPECT_EQ(s["hearth_requests_total{route=\"/v1/chat/completions\",status=\"400\"}"], 1);
  EXPECT_EQ(s["hearth_requests_total{route=\"/v1/messages\",status=\"200\"}"], 1);
  EXPECT_EQ(s["hearth_requests_total{route=\"/v1/responses\",status=\"200\"}"], 1);
  EXPECT_EQ(s["hearth_requests_total{route=\"/v1/models\",status=\"401\"}"], 1);
  EXPECT_EQ(s["hearth_requests_total{route=\"/health\",status=\"200\"}"], 1);
  EXPECT_EQ(s.count("hearth_requests_total{route=\"/metrics\",status=\"200\"}"), 0u);  // counted after it answers
  EXPECT_EQ(s["hearth_prompt_tokens_total"], 4 + 5 + 4 + 3);
  EXPECT_EQ(s["hearth_generation_tokens_total"], 3 + 4 + 3 + 2);
  EXPECT_EQ(s["hearth_queue_length"], 0);
  EXPECT_EQ(s["hearth_running_sequences"], 0);
  EXPECT_EQ(s.count("hearth_cache_reserved_bytes"), 1u);
  EXPECT_EQ(s["hearth_cache_reserved_bytes"], 0);  // no memory budget: nothing reserved
  EXPECT_EQ(s.count("hearth_memory_budget_bytes"), 1u);
  EXPECT_EQ(s["hearth_memory_budget_bytes"], 0);
  EXPECT_EQ(s["hearth_client_disconnects_total{stream=\"false\"}"], 0);
  EXPECT_EQ(s["hearth_client_disconnects_total{stream=\"true\"}"], 0);
  EXPECT_EQ(s["hearth_prompt_cache_hits_total"], 0);
  EXPECT_EQ(s["hearth_prompt_cache_hit_tokens_total"], 0);
  EXPECT_EQ(s["hearth_request_duration_seconds_count"], 4);
  EXPECT_EQ(s["hearth_time_to_first_token_seconds_count"], 4);
  // Each admitted request waited in the queue less than it took to its first token.
  EXPECT_EQ(s["hearth_request_queue_time_seconds_count"], 4);
  EXPECT_GE(s["hearth_request_queue_time_seconds_sum"], 0);
  EXPECT_LE(s["hearth_request_queue_time_seconds_sum"], s["hearth_time_to_first_token_seconds_sum"]);
  // One gap per generated token after the first: 2 + 3 + 2 + 1.
  EXPECT_EQ(s["hearth_inter_token_latency_seconds_count"], 8);
  EXPECT_GT(s["hearth_request_duration_seconds_sum"], 0);
  EXPECT_LT(s["hearth_request_duration_seconds_sum"], 10);
  EXPECT_EQ(s["hearth_request_duration_seconds_bucket{le=\"+Inf\"}"], 4);
  // A second scrape sees the first one counted.
  s = parse_exposition(client().Get("/metrics")->body);
  EXPECT_EQ(s["hearth_requests_total{route=\"/metrics\",status=\"200\"}"], 1);
}

TEST_F(ServerTest, MetricsSeeARunningSequenceAndTheQueue) {
  start({}, FakeEngineOptions{"fake-model", 4096, 40});
  const std::string slow = chat_body("emit:" + std::string(45, 'x'));  // 15 tokens * 40 ms
  std::thread a([&] { EXPECT_EQ(post("/v1/chat/completions", slow)->status, 200); });
  for (int i = 0; i < 200 && !engine_->busy(); ++i) std::this_thread::sleep_for(5ms);
  std::thread b([&] { EXPECT_EQ(post("/v1/chat/completions", slow)->status, 200); });
  std::this_thread::sleep_for(150ms);  // b is queued behind a
  auto s = parse_exposition(client().Get("/metrics")->body);
  EXPECT_EQ(s["hearth_running_sequences"], 1);
  EXPECT_EQ(s["hearth_queue_length"], 1);
  a.join();
  b.join();
  s = parse_exposition(client().Get("/metrics")->body);
  EXPECT_EQ(s["hearth_running_sequences"], 0);
  EXPECT_EQ(s["hearth_queue_length"], 0);
  EXPECT_EQ(s["hearth_generation_tokens_total"], 32);  // 2 * (15 pieces + EOS)
}

}  // namespace
}  // namespace hearth::server
