// Sampler chain: repetition → presence → frequency penalty → top-p → min-p → top-k → categorical at temperature,
// in the order and with the comparisons of mlx-lm's sample_utils.py, plus two guards mlx-lm lacks: every
// filter keeps the most likely token, and penalties/temperatures at their extremes stay finite (greedy at worst).
#include "generate/sampler.h"

#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

namespace hearth::generate {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The largest finite value of a floating dtype: penalties at their extremes (1e-300, 1e308) clamp
// here instead of becoming ±inf (an inf logit turns the log-softmax into NaN).
double finite_max(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return std::numeric_limits<double>::max();
    case at::kHalf: return 65504.0;
    case at::kBFloat16: return 3.3895313892515355e38;
    default: return std::numeric_limits<float>::max();
  }
}

// x computed in double, clamped to `like`'s finite range and cast back to its dtype.
at::Tensor clamp_to(const at::Tensor& x, const at::Tensor& like) {
  const double m = finite_max(like.scalar_type());
  return x.clamp(-m, m).to(like.scalar_type());
}

// The last `size` tokens (all when size is 0 or larger than the history).
std::vector<int64_t> window(const std::vector<int64_t>& tokens, int64_t size) {
  const size_t n = size <= 0 ? tokens.size() : std::min<size_t>(tokens.size(), static_cast<size_t>(size));
  return std::vector<int64_t>(tokens.end() - n, tokens.end());
}

// Subtracts penalty × weight(id) where weight counts occurrences (or 1 per distinct id).
at::Tensor subtract_counts(const at::Tensor& logits, const std::vector<int64_t>& context, double penalty,
                           bool per_occurrence) {
  at::Tensor out = logits.clone();
  std::vector<int64_t> ids;
  std::vector<double> amount;
  std::unordered_map<int64_t, size_t> pos;
  for (int64_t id : context) {
    if (id < 0 || id >= logits.size(-1)) continue;
    auto [it, fresh] = pos.emplace(id, ids.size());
    if (fresh) {
      ids.push_back(id);
      amount.push_back(penalty);
    } else if (per_occurrence) {
      amount[it->second] += penalty;
    }
  }
  if (ids.empty()) return out;
  at::Tensor idx = at::tensor(ids, at::TensorOptions().dtype(at::kLong)).to(logits.device());
  at::Tensor sub = at::tensor(amount, at::TensorOptions().dtype(at::kDouble)).to(logits.device());
  out.index_copy_(-1, idx, clamp_to(out.index_select(-1, idx).to(at::kDouble) - sub, out));
  return out;
}
}  // namespace

at::Tensor apply_presence_penalty(const at::Tensor& logits, const std::vector<int64_t>& context, double penalty) {
  return subtract_counts(logits, context, penalty, /*per_occurrence=*/false);
}

at::Tensor apply_frequency_penalty(const at::Tensor& logits, const std::vector<int64_t>& context, double penalty) {
  return subtract_counts(logits, context, penalty, /*per_occurrence=*/true);
}

at::Tensor apply_repetition_penalty(const at::Tensor& logits, const std::vector<int64_t>& context, double penalty) {
  at::Tensor out = logits.clone();
  if (context.empty() || penalty == 0 || penalty == 1) return out;  // 0 = off, 1 = no change
  std::vector<int64_t> ids;
  std::unordered_set<int64_t> seen;
  for (int64_t id : context)
    if (id >= 0 && id < logits.size(-1) && seen.insert(id).second) ids.push_back(id);
  at::Tensor idx = at::tensor(ids, at::TensorOptions().dtype(at::kLong)).to(logits.device());
  // In double, then clamped: a penalty of 1e-300 must not turn a positive logit into +inf (nor 0/0
  // into NaN in float32, where 1e-300 is 0).
  at::Tensor sel = out.index_select(-1, idx).to(at::kDouble);
  sel = at::where(sel < 0, sel * penalty, sel / penalty);
  out.index_copy_(-1, idx, clamp_to(sel, out));
  return out;
}

at::Tensor apply_top_p(const at::Tensor& logprobs, double top_p) {
  at::Tensor probs = logprobs.exp();
  at::Tensor sorted_idx = at::argsort(logprobs, -1, /*descending=*/false);
  at::Tensor cumulative = probs.index_select(-1, sorted_idx).cumsum(-1);
  at::Tensor cum_orig = at::empty_like(cumulative).index_copy_(-1, sorted_idx, cumulative);
  at::Tensor keep = cum_orig > (1 - top_p);
  // The most likely token always survives: for a tiny top_p, 1 - top_p rounds to 1 and the float
  // cumulative sum may end just below it, which would keep nothing.
  keep.index_fill_(-1, logprobs.argmax(-1).reshape({1}), true);
  return at::where(keep, logprobs, at::full({}, kNegInf, logprobs.options()));
}

at::Tensor apply_min_p(const at::Tensor& logprobs, double min_p, int64_t min_keep) {
  at::Tensor sorted_idx = at::argsort(logprobs, -1, /*descending=*/true);
  at::Tensor sorted = logprobs.index_select(-1, sorted_idx);
  at::Tensor threshold = sorted.narrow(-1, 0, 1) + std::log(min_p);
  at::Tensor remove = sorted < threshold;
  // At least the best token (even with min_keep 0), so min_p 1.0 keeps the maximum.
  remove.narrow(-1, 0, std::min<int64_t>(std::max<int64_t>(min_keep, 1), remove.size(-1))).fill_(false);
  at::Tensor kept = at::where(remove, at::full({}, kNegInf, sorted.options()), sorted);
  return at::empty_like(kept).index_copy_(-1, sorted_idx, kept);
}

at::Tensor apply_top_k(const at::Tensor& logprobs, int64_t top_k) {
  if (top_k <= 0 || top_k >= logprobs.size(-1)) return logprobs;  // 0 = off
  at::Tensor top_idx = std::get<1>(at::topk(logprobs, top_k, -1));
  at::Tensor out = at::full_like(logprobs, kNegInf);
  out.index_copy_(-1, top_idx, logprobs.index_select(-1, top_idx));
  return out;
}

Sampler::Sampler(SamplingParams params) : params_(params), rng_(params.seed) {
  HEARTH_CHECK(params_.temperature >= 0 && std::isfinite(params_.temperature),
               "sampling: temperature must be finite and >= 0, got ", params_.temperature);
  HEARTH_CHECK(params_.top_p >= 0 && params_.top_p <= 1, "sampling: top_p must be in [0, 1], got ", params_.top_p);
  HEARTH_CHECK(params_.min_p >= 0 && params_.min_p <= 1, "sampling: min_p must be in [0, 1], got ", params_.min_p);
  HEARTH_CHECK(params_.top_k >= 0, "sampling: top_k must be >= 0, got ", params_.top_k);
  HEARTH_CHECK(params_.repetition_penalty >= 0 && std::isfinite(params_.repetition_penalty),
               "sampling: repetition_penalty must be finite and >= 0, got ", params_.repetition_penalty);
  HEARTH_CHECK(params_.repetition_context_size >= 0, "sampling: repetition_context_size must be >= 0");
  HEARTH_CHECK(std::isfinite(params_.presence_penalty) && std::isfinite(params_.frequency_penalty),
               "sampling: presence/frequency penalties must be finite");
  HEARTH_CHECK(params_.presence_context_size >= 0 && params_.frequency_context_size >= 0,
               "sampling: presence/frequency context sizes must be >= 0");
}

at::Tensor Sampler::process(const at::Tensor& logits_in, const std::vector<int64_t>& tokens) const {
  HEARTH_CHECK(logits_in.dim() == 1, "Sampler: logits must be [V], got ", logits_in.sizes());
  at::Tensor logits = logits_in.to(at::kFloat);
  const SamplingParams& p = params_;
  if (!p.logit_bias.empty()) {
    if (logits.data_ptr() == logits_in.data_ptr()) logits = logits.clone();  // never touch the caller's tensor
    std::vector<int64_t> ids;
    std::vector<float> bias;
    for (const auto& [id, b] : p.logit_bias) {
      HEARTH_CHECK(id >= 0 && id < logits.size(0), "logit_bias: token id ", id, " outside the vocabulary of ",
                   logits.size(0));
      ids.push_back(id);
      bias.push_back(static_cast<float>(b));
    }
    logits.index_add_(0, at::tensor(ids, at::kLong).to(logits.device()),
                      at::tensor(bias, at::kFloat).to(logits.device()));
  }
  // mlx-lm: "if repetition_penalty" (0 = off); 1 changes nothing, so it is skipped too.
  if (!tokens.empty() && p.repetition_penalty != 0 && p.repetition_penalty != 1)
    logits = apply_repetition_penalty(logits, window(tokens, p.repetition_context_size), p.repetition_penalty);
  if (!tokens.empty() && p.presence_penalty != 0)
    logits = apply_presence_penalty(logits, window(tokens, p.presence_context_size), p.presence_penalty);
  if (!tokens.empty() && p.frequency_penalty != 0)
    logits = apply_frequency_penalty(logits, window(tokens, p.frequency_context_size), p.frequency_penalty);
  // Last, so forbidden tokens are exactly -inf (the penalties clamp to finite values).
  if (p.constraint) {
    if (logits.data_ptr() == logits_in.data_ptr()) logits = logits.clone();
    p.constraint->mask(logits);
  }
  return logits;
}

int64_t Sampler::sample(const at::Tensor& logits, const std::vector<int64_t>& tokens) {
  return sample_processed(process(logits, tokens));
}

int64_t Sampler::sample_processed(const at::Tensor& logits) {
  const int64_t token = draw(logits);
  if (params_.constraint) params_.constraint->accept(token);
  return token;
}

int64_t Sampler::draw(const at::Tensor& logits) {
  HEARTH_CHECK(logits.dim() == 1, "Sampler: logits must be [V], got ", logits.sizes());
  const SamplingParams& p = params_;
  if (p.temperature == 0) return logits.argmax(-1).item<int64_t>();

  at::Tensor lp = logits.to(at::kCPU, at::kFloat);
  lp = lp - at::logsumexp(lp, -1, /*keepdim=*/true);
  if (p.top_p > 0 && p.top_p < 1) lp = apply_top_p(lp, p.top_p);
  if (p.min_p != 0) lp = apply_min_p(lp, p.min_p, p.min_tokens_to_keep);
  if (p.top_k > 0) lp = apply_top_k(lp, p.top_k);

  // Categorical over softmax(lp / temp), by inverse CDF with our own generator. In double, with the
  // maximum subtracted before dividing: the kept maximum is exactly 0 at any temperature, so a
  // temperature near zero (1e-30, or subnormal, whose reciprocal is inf) is greedy, never inf/NaN.
  at::Tensor x = lp.to(at::kDouble);
  const double top = x.max().item<double>();
  if (!std::isfinite(top)) return logits.argmax(-1).item<int64_t>();  // nothing finite left: greedy
  at::Tensor probs = at::softmax((x - top) / p.temperature, -1).contiguous();
  const double* pr = probs.data_ptr<double>();
  const int64_t V = probs.size(0);
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double acc = 0;
  int64_t last_positive = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (pr[i] <= 0) continue;
    last_positive = i;
    acc += pr[i];
    if (u < acc) return i;
  }
  return last_positive;  // rounding left u beyond the total
}

at::Tensor argmax_blocked(const at::Tensor& logits, int64_t c) {
  const int64_t V = logits.dim() > 0 ? logits.size(-1) : 0;
  HEARTH_CHECK(c >= 1 && V % c == 0 && V > 0, "argmax_blocked: block ", c, " does not divide the last dim ", V);
  std::vector<int64_t> sizes = logits.sizes().vec();
  sizes.back() = V / c;
  sizes.push_back(c);
  auto [vals, idx] = at::max(logits.reshape(sizes), -1);  // [..., V/c] block maxima, first index in each
  at::Tensor blk = vals.argmax(-1, /*keepdim=*/true);     // [..., 1] the first block with the maximum
  return (blk * c + idx.gather(-1, blk)).squeeze(-1);
}

at::Tensor argmax_last(const at::Tensor& logits) {
  const int64_t V = logits.dim() > 0 ? logits.size(-1) : 0;
  if (logits.is_cuda())
    for (int64_t c : {1024, 512, 256, 128, 64})
      if (V % c == 0 && V / c >= 2) return argmax_blocked(logits, c);
  return logits.argmax(-1);
}

}  // namespace hearth::generate
