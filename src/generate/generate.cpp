// Prefill in chunks, then token-by-token decode through the model's caches.
#include <c10/core/GradMode.h>
#include "generate/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/torch_compat.h"

namespace hearth::generate {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

GenerationResult generate(models::Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                          const TokenCallback& on_token) {
  StepCallback step;
  if (on_token) step = [&](int64_t token, const at::Tensor&) { return on_token(token); };
  return generate(model, prompt, opts, step);
}

GenerationResult generate(models::Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                          const StepCallback& on_step) {
  cache::Caches caches;
  return generate(model, prompt, opts, caches, on_step);
}

GenerationResult generate(models::Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                          cache::Caches& caches, const StepCallback& on_step) {
  HEARTH_CHECK(!prompt.empty(), "generate: the prompt is empty");
  HEARTH_CHECK(opts.prefill_step_size > 0, "generate: prefill_step_size must be positive");
  for (int64_t id : prompt)
    HEARTH_CHECK(id >= 0 && id < model.vocab_size(), "generate: prompt token id ", id, " is outside the vocabulary [0, ",
                 model.vocab_size(), ")");
  c10::NoGradGuard no_grad;
  const at::Device device = model.placement().device;
  compat::reset_peak_memory(device);
  Sampler sampler(opts.sampling);
  GenerationResult result;
  GenerationStats& st = result.stats;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  std::vector<int64_t> tokens = prompt;  // context for the repetition penalty
  if (caches.empty()) caches = model.make_cache();
  int64_t offset = cache::offset_of(caches);
  HEARTH_CHECK(offset < st.prompt_tokens, "generate: the caches already hold ", offset, " tokens, the prompt has ",
               st.prompt_tokens, " (at least one prompt token must be prefilled)");
  st.cached_tokens = offset;
  auto ids_opts = at::TensorOptions().dtype(at::kLong);

  const auto t0 = Clock::now();
  at::Tensor logits;
  const int64_t n = st.prompt_tokens;
  const int64_t prefilled = n - offset;
  while (offset < n) {
    const int64_t len = std::min(opts.prefill_step_size, n - offset);
    at::Tensor ids = at::tensor(std::vector<int64_t>(prompt.begin() + offset, prompt.begin() + offset + len), ids_opts)
                         .view({1, len})
                         .to(device);
    logits = model.forward(ids, offset, &caches, /*logits_to_keep=*/offset + len == n ? 1 : 0);
    offset += len;
  }
  if (opts.max_tokens <= 0) {
    compat::synchronize(device);
    st.ttft_s = seconds(t0, Clock::now());
    st.prompt_tps = prefilled / std::max(st.ttft_s, 1e-9);
    st.peak_memory_bytes = compat::peak_memory_bytes(device);
    return result;
  }
  // One step: processors → (log-probabilities for the callback) → sampler.
  at::Tensor step_logprobs;
  auto sample_step = [&](const at::Tensor& last) {
    at::Tensor processed = sampler.process(last, tokens);
    if (opts.logprobs) step_logprobs = at::log_softmax(processed, -1);
    return sampler.sample_processed(processed);
  };
  int64_t next = sample_step(logits[0][-1]);
  const auto t1 = Clock::now();
  st.ttft_s = seconds(t0, t1);
  st.prompt_tps = prefilled / std::max(st.ttft_s, 1e-9);

  auto t_last = t1;
  while (true) {
    if (std::find(opts.eos_ids.begin(), opts.eos_ids.end(), next) != opts.eos_ids.end()) {
      st.stopped_by_eos = true;
      break;
    }
    result.tokens.push_back(next);
    tokens.push_back(next);
    t_last = Clock::now();
    if (on_step && !on_step(next, step_logprobs)) break;
    if (static_cast<int64_t>(result.tokens.size()) >= opts.max_tokens) break;
    at::Tensor ids = at::full({1, 1}, next, ids_opts).to(device);
    logits = model.forward(ids, offset, &caches);
    offset += 1;
    next = sample_step(logits[0][-1]);
  }
  st.generation_tokens = static_cast<int64_t>(result.tokens.size());
  // Like mlx-lm: generation speed over the tokens after the first.
  const double gen_s = seconds(t1, t_last);
  st.generation_tps = st.generation_tokens > 1 ? (st.generation_tokens - 1) / std::max(gen_s, 1e-9) : 0.0;
  st.peak_memory_bytes = compat::peak_memory_bytes(device);
  return result;
}

}  // namespace hearth::generate
