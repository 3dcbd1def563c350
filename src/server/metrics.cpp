// Prometheus text exposition of the server's counters and histograms (see metrics.h).
// Follows prometheus.io "Exposition formats" (text 0.0.4). Not a client library.
#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace hearth::server {
namespace {

// A sample value: integers as integers, others with enough digits to round-trip.
std::string value_text(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back as v
  return std::string(buf, r.ptr);
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, double v) { out += name + " " + value_text(v) + "\n"; }

void histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  header(out, name, "histogram", help);
  uint64_t cum = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cum += h.counts[i];
    sample(out, std::string(name) + "_bucket{le=\"" + value_text(h.bounds[i]) + "\"}", static_cast<double>(cum));
  }
  sample(out, std::string(name) + "_bucket{le=\"+Inf\"}", static_cast<double>(cum + h.inf_count));
  sample(out, std::string(name) + "_sum", h.sum);
  sample(out, std::string(name) + "_count", static_cast<double>(h.count));
}

}  // namespace

void Histogram::observe(double value, uint64_t n) {
  if (!(value >= 0) || n == 0) return;
  size_t i = 0;
  while (i < bounds.size() && value > bounds[i]) ++i;
  if (i < bounds.size()) counts[i] += n;
  else inf_count += n;
  sum += value * static_cast<double>(n);
  count += n;
}

std::string prometheus_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0, 160.0, 640.0, 2560.0}),
      queue_(ttft_.bounds),  // the same buckets as TTFT
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      duration_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                 960.0, 1920.0, 7680.0}) {}

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{route, status}];
}

void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += static_cast<uint64_t>(std::max<int64_t>(n, 0));
}

void Metrics::add_generation(const GenerationSample& s) {
  std::lock_guard<std::mutex> lock(mu_);
  generation_tokens_ += static_cast<uint64_t>(std::max<int64_t>(s.generation_tokens, 0));
  if (s.cached_tokens > 0) {
    ++cache_hits_;
    cache_hit_tokens_ += static_cast<uint64_t>(s.cached_tokens);
  }
}

void Metrics::observe_ttft(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::observe_queue(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.observe(seconds);
}

void Metrics::observe_itl(double seconds, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(seconds, n);
}

void Metrics::observe_duration(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  duration_.observe(seconds);
}

void Metrics::add_running(int delta) {
  std::lock_guard<std::mutex> lock(mu_);
  running_ += delta;
}

void Metrics::count_client_disconnect(bool stream) {
  std::lock_guard<std::mutex> lock(mu_);
  ++disconnects_[stream ? 1 : 0];
}

std::string Metrics::render(size_t queue_length, const CacheBudgetGauges& budget) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  header(out, "hearth_requests_total", "counter", "HTTP requests answered, by route and status code.");
  for (const auto& [key, n] : requests_)
    sample(out, "hearth_requests_total{route=\"" + prometheus_label_value(key.first) + "\",status=\"" +
                    std::to_string(key.second) + "\"}",
           static_cast<double>(n));
  header(out, "hearth_prompt_tokens_total", "counter", "Prompt tokens of requests that started generating.");
  sample(out, "hearth_prompt_tokens_total", static_cast<double>(prompt_tokens_));
  header(out, "hearth_generation_tokens_total", "counter", "Tokens generated (a final EOS included, as in usage).");
  sample(out, "hearth_generation_tokens_total", static_cast<double>(generation_tokens_));
  header(out, "hearth_prompt_cache_hits_total", "counter", "Requests that reused prompt tokens from the prompt cache.");
  sample(out, "hearth_prompt_cache_hits_total", static_cast<double>(cache_hits_));
  header(out, "hearth_prompt_cache_hit_tokens_total", "counter", "Prompt tokens served from the prompt cache (not prefilled).");
  sample(out, "hearth_prompt_cache_hit_tokens_total", static_cast<double>(cache_hit_tokens_));
  header(out, "hearth_client_disconnects_total", "counter",
         "Generation requests cancelled because their client closed the connection before the answer was complete.");
  sample(out, "hearth_client_disconnects_total{stream=\"false\"}", static_cast<double>(disconnects_[0]));
  sample(out, "hearth_client_disconnects_total{stream=\"true\"}", static_cast<double>(disconnects_[1]));
  header(out, "hearth_queue_length", "gauge", "Requests waiting for the engine.");
  sample(out, "hearth_queue_length", static_cast<double>(queue_length));
  header(out, "hearth_running_sequences", "gauge", "Requests generating now.");
  sample(out, "hearth_running_sequences", static_cast<double>(running_));
  header(out, "hearth_cache_reserved_bytes", "gauge",
         "Cache bytes the running requests reserved against --memory-budget (each: fixed + bytes per token x "
         "(prompt + max_tokens) rounded up + the sliding-window layers' share, per choice).");
  sample(out, "hearth_cache_reserved_bytes", static_cast<double>(budget.reserved_bytes));
  header(out, "hearth_memory_budget_bytes", "gauge",
         "Cache bytes the running requests may reserve together (--memory-budget less the decode slots; 0 = no limit).");
  sample(out, "hearth_memory_budget_bytes", static_cast<double>(budget.budget_bytes));
  header(out, "hearth_request_charge_bytes_per_token", "gauge",
         "A request's charge per token of prompt + max_tokens (KV bytes of all layers).");
  sample(out, "hearth_request_charge_bytes_per_token", static_cast<double>(budget.per_token_bytes));
  header(out, "hearth_request_charge_fixed_bytes", "gauge",
         "A request's charge that does not grow with tokens (recurrent states).");
  sample(out, "hearth_request_charge_fixed_bytes", static_cast<double>(budget.fixed_bytes));
  header(out, "hearth_request_charge_round_to_tokens", "gauge",
         "prompt + max_tokens is rounded up to a multiple of this (the caches' growth step) before charging.");
  sample(out, "hearth_request_charge_round_to_tokens", static_cast<double>(budget.round_to_tokens));
  header(out, "hearth_request_charge_window_bytes_per_token", "gauge",
         "A request's charge per token of the sliding-window layers, for at most "
         "hearth_request_charge_window_tokens of prompt + max_tokens (0 = no such layers).");
  sample(out, "hearth_request_charge_window_bytes_per_token", static_cast<double>(budget.window_per_token_bytes));
  header(out, "hearth_request_charge_window_tokens", "gauge",
         "The most tokens a sliding-window layer holds: its window - 1 plus one prefill chunk.");
  sample(out, "hearth_request_charge_window_tokens", static_cast<double>(budget.window_tokens));
  histogram(out, "hearth_time_to_first_token_seconds", "Seconds from a request's arrival to its first output text.", ttft_);
  histogram(out, "hearth_request_queue_time_seconds",
            "Seconds from a request's arrival to its admission into the running batch (before its prefill).", queue_);
  histogram(out, "hearth_inter_token_latency_seconds",
            "Seconds between generated tokens (each request's mean gap after its first output, once per gap).", itl_);
  histogram(out, "hearth_request_duration_seconds", "Seconds from a generation request's arrival to its last event.",
            duration_);
  return out;
}

}  // namespace hearth::server
