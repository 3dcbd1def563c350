// Token sampling with mlx-lm's semantics (mlx_lm/sample_utils.py: make_logits_processors,
// make_sampler): repetition, presence and frequency penalties over the last N tokens, then top-p,
// min-p and top-k filtering on log-probabilities, then a categorical draw at the temperature
// (temp 0: argmax).
// Not stop-string handling or the generation loop (generate.h).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "generate/constraint.h"

namespace hearth::generate {

struct SamplingParams {
  double temperature = 0.0;       // 0 = greedy
  double top_p = 0.0;             // active when 0 < top_p < 1
  int64_t top_k = 0;              // active when > 0
  double min_p = 0.0;             // active when != 0
  int64_t min_tokens_to_keep = 1; // min-p keeps at least this many
  double repetition_penalty = 0.0;  // active when != 0 and != 1 (mlx-lm: "if repetition_penalty")
  int64_t repetition_context_size = 20;
  double presence_penalty = 0.0;    // active when != 0; subtracted once per distinct token in the window
  int64_t presence_context_size = 20;
  double frequency_penalty = 0.0;   // active when != 0; subtracted once per occurrence in the window
  int64_t frequency_context_size = 20;
  uint64_t seed = 0;
  /// OpenAI logit_bias / mlx-lm make_logits_processors(logit_bias): (token id, bias) pairs added
  /// to the logits first, every step. Ids must lie in [0, V) (the engine checks).
  std::vector<std::pair<int64_t, double>> logit_bias;
  /// Structured outputs (src/grammar/): when set, process() masks the tokens it forbids (last, so
  /// they are exactly -inf and logprobs are the constrained distribution) and
  /// sample_processed() tells it the token drawn. Stateful: one per sequence.
  std::shared_ptr<TokenConstraint> constraint;
};

/// y = logits with the penalty applied to the ids in `context` (each id once): positive logits
/// divided by `penalty`, negative multiplied. logits [V] float; returns a new tensor.
at::Tensor apply_repetition_penalty(const at::Tensor& logits, const std::vector<int64_t>& context, double penalty);

/// mlx-lm make_presence_penalty: logits [V] minus `penalty` at every distinct id of `context`
/// (OpenAI's presence penalty, over a window). Returns a new tensor.
at::Tensor apply_presence_penalty(const at::Tensor& logits, const std::vector<int64_t>& context, double penalty);
/// mlx-lm make_frequency_penalty: logits [V] minus `penalty` × (occurrences of the id in
/// `context`) (OpenAI's frequency penalty, over a window). Returns a new tensor.
at::Tensor apply_frequency_penalty(const at::Tensor& logits, const std::vector<int64_t>& context, double penalty);

/// Filters on log-probabilities [V] (float32, CPU): removed entries become -inf.
/// top_p: keep tokens whose ascending cumulative probability (including themselves) > 1 - top_p.
at::Tensor apply_top_p(const at::Tensor& logprobs, double top_p);
/// min_p: keep tokens with logprob >= max logprob + log(min_p) (at least `min_keep` best).
at::Tensor apply_min_p(const at::Tensor& logprobs, double min_p, int64_t min_keep);
/// top_k: keep the k largest.
at::Tensor apply_top_k(const at::Tensor& logprobs, int64_t top_k);

/// logits.argmax(-1) (the first maximum; a NaN counts as the maximum) in two reductions over
/// [..., V/c, c] blocks: the maximum and its first index per block, then the first block holding
/// the overall maximum. Same indices as argmax for any c dividing V (V = logits.size(-1)); throws
/// hearth::Error when c does not divide V or c < 1.
at::Tensor argmax_blocked(const at::Tensor& logits, int64_t c);

/// The decode step's greedy pick: argmax_blocked with c the largest of 1024..64 dividing V (and
/// leaving ≥ 2 blocks) on CUDA, where argmax reduces a row inside one thread block (an H200: 40 µs
/// for one 128,256-entry row, ~4 µs in blocks); logits.argmax(-1) elsewhere. int64 [...].
at::Tensor argmax_last(const at::Tensor& logits);

/// A stateful sampler: owns its random generator (seeded by params.seed), so equal seeds give
/// equal token sequences on any device.
class Sampler {
 public:
  explicit Sampler(SamplingParams params);

  /// The next token for `logits` [V] (any device/float dtype) given all tokens so far
  /// (prompt + generated, as mlx-lm's history; each penalty looks at its last *_context_size,
  /// 0 = all). Same as sample_processed(process(logits, tokens)).
  int64_t sample(const at::Tensor& logits, const std::vector<int64_t>& tokens);

  /// The logits processors alone, in mlx-lm's order (logit bias → repetition → presence → frequency),
  /// then the constraint's mask:
  /// logits [V] → float32 logits [V] on the same device. Their log-softmax is the distribution
  /// mlx-lm reports as logprobs (before top-p/min-p/top-k truncation and temperature).
  at::Tensor process(const at::Tensor& logits, const std::vector<int64_t>& tokens) const;
  /// The sampler alone on processed logits [V]: argmax at temperature 0, else top-p → min-p →
  /// top-k → categorical over softmax(logprobs / temperature). The token drawn is passed to
  /// params.constraint->accept when a constraint is set (which throws for a token it forbids).
  int64_t sample_processed(const at::Tensor& processed);

  const SamplingParams& params() const { return params_; }

 private:
  int64_t draw(const at::Tensor& processed);
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace hearth::generate
