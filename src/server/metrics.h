// The server's Prometheus metrics: counters, gauges and histograms kept by the HTTP layer as a
// request's events pass, and their text exposition format (version 0.0.4) for GET /metrics.
// Not a general metrics library (no registry, no client library is packaged) and not the engine.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace hearth::server {

/// A Prometheus histogram: cumulative bucket counts over fixed upper bounds (seconds), sum, count.
/// Not thread-safe by itself (Metrics locks around it).
struct Histogram {
  std::vector<double> bounds;    ///< ascending upper bounds; +Inf is implicit
  std::vector<uint64_t> counts;  ///< per bound, non-cumulative (rendered cumulative)
  uint64_t inf_count = 0;        ///< observations above the last bound
  double sum = 0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size(), 0) {}
  /// Adds `n` observations of `value` (a negative or NaN value is ignored).
  void observe(double value, uint64_t n = 1);
};

/// What one finished generation adds to the metrics.
struct GenerationSample {
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;  ///< completion tokens (a final EOS included, as in usage)
  int64_t cached_tokens = 0;      ///< prompt tokens served from the prompt cache
};

/// The cache-budget gauges, read at scrape time (EngineLoop and Engine::state_charge): what the
/// running requests reserved, the budget, and the terms of a request's charge, which is, with
/// t = prompt + max_tokens and R(n) = n rounded up to round_to tokens, fixed + per_token * R(t)
/// + window_per_token * R(min(t, window_tokens)), per choice (Engine::StateCharge).
struct CacheBudgetGauges {
  int64_t reserved_bytes = 0;
  int64_t budget_bytes = 0;  ///< 0 = no --memory-budget
  int64_t per_token_bytes = 0;
  int64_t fixed_bytes = 0;
  int64_t round_to_tokens = 0;
  int64_t window_per_token_bytes = 0;  ///< sliding-window layers (0 = none)
  int64_t window_tokens = 0;
};

/// All metrics of one server; every method is thread-safe (one mutex: updates are a few adds).
/// Names (all prefixed hearth_): requests_total{route,status}, prompt_tokens_total,
/// generation_tokens_total, prompt_cache_hits_total (requests with cached tokens),
/// prompt_cache_hit_tokens_total, client_disconnects_total{stream} (generations cancelled because
/// their client left before the answer was complete), queue_length and running_sequences (gauges),
/// time_to_first_token_seconds, request_queue_time_seconds, inter_token_latency_seconds,
/// request_duration_seconds (histograms; buckets follow vLLM's for the same metrics).
class Metrics {
 public:
  Metrics();

  /// One answered HTTP request. `route` must be a fixed pattern (e.g. "/v1/models/{model}"),
  /// never a raw path, to bound the label set.
  void count_request(const std::string& route, int status);
  /// Prompt tokens of a request that started generating (prefill done or under way).
  void add_prompt_tokens(int64_t n);
  /// A generation that ended (kDone): generated tokens and prompt-cache use.
  void add_generation(const GenerationSample& s);
  void observe_ttft(double seconds);
  /// Seconds from a request's arrival to its admission into the running batch (its kStarted
  /// event: the prompt built, a seat and its cache budget taken); TTFT minus this is the prefill
  /// and the first step (vLLM's request_queue_time_seconds).
  void observe_queue(double seconds);
  /// `n` inter-token gaps of `seconds` each (a request's mean gap, counted once per gap).
  void observe_itl(double seconds, uint64_t n);
  void observe_duration(double seconds);
  /// Sequences generating now: +1 when one starts, -1 when it ends.
  void add_running(int delta);
  /// A generation request whose client closed its connection before the answer was complete (its
  /// job was cancelled); `stream`: the request streamed (SSE) or waited for one JSON body.
  void count_client_disconnect(bool stream);

  /// The exposition text: # HELP / # TYPE lines, then samples; `queue_length` and the budget
  /// gauges are read by the caller at scrape time: hearth_cache_reserved_bytes (what the running
  /// requests reserved against --memory-budget), hearth_memory_budget_bytes,
  /// hearth_request_charge_bytes_per_token, hearth_request_charge_fixed_bytes and
  /// hearth_request_charge_round_to_tokens (see CacheBudgetGauges).
  std::string render(size_t queue_length, const CacheBudgetGauges& budget = {}) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0, cache_hits_ = 0, cache_hit_tokens_ = 0;
  int64_t running_ = 0;
  uint64_t disconnects_[2] = {0, 0};  // [non-streaming, streaming]
  Histogram ttft_, queue_, itl_, duration_;
};

/// A Prometheus label value escaped (backslash, double quote, newline).
std::string prometheus_label_value(const std::string& v);

}  // namespace hearth::server
