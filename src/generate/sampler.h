// Token sampling with mlx-lm's semantics (mlx_lm/sample_utils.py: make_logits_processors,
// make_sampler): repetition penalty over the last N tokens, then top-p, min-p and top-k
// filtering on log-probabilities, then a categorical draw at the temperature (temp 0: argmax).
// Not stop-string handling or the generation loop (generate.h).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace hearth::generate {

struct SamplingParams {
  double temperature = 0.0;       // 0 = greedy
  double top_p = 0.0;             // active when 0 < top_p < 1
  int64_t top_k = 0;              // active when > 0
  double min_p = 0.0;             // active when != 0
  int64_t min_tokens_to_keep = 1; // min-p keeps at least this many
  double repetition_penalty = 0.0;  // active when != 0 and != 1 (mlx-lm: "if repetition_penalty")
  int64_t repetition_context_size = 20;
  uint64_t seed = 0;
};

/// y = logits with the penalty applied to the ids in `context` (each id once): positive logits
/// divided by `penalty`, negative multiplied. logits [V] float; returns a new tensor.
at::Tensor apply_repetition_penalty(const at::Tensor& logits, const std::vector<int64_t>& context, double penalty);

/// Filters on log-probabilities [V] (float32, CPU): removed entries become -inf.
/// top_p: keep tokens whose ascending cumulative probability (including themselves) > 1 - top_p.
at::Tensor apply_top_p(const at::Tensor& logprobs, double top_p);
/// min_p: keep tokens with logprob >= max logprob + log(min_p) (at least `min_keep` best).
at::Tensor apply_min_p(const at::Tensor& logprobs, double min_p, int64_t min_keep);
/// top_k: keep the k largest.
at::Tensor apply_top_k(const at::Tensor& logprobs, int64_t top_k);

/// A stateful sampler: owns its random generator (seeded by params.seed), so equal seeds give
/// equal token sequences on any device.
class Sampler {
 public:
  explicit Sampler(SamplingParams params);

  /// The next token for `logits` [V] (any device/float dtype) given all tokens so far
  /// (prompt + generated; the last repetition_context_size are penalized).
  int64_t sample(const at::Tensor& logits, const std::vector<int64_t>& tokens);

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace hearth::generate
