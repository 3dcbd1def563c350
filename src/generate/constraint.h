// The hook through which structured outputs restrict decoding: a per-request, stateful
// constraint that says which tokens may come next and is told which token was chosen.
// Not a grammar (src/grammar/ implements this interface) and not the sampler (sampler.h calls it).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace hearth::generate {

/// A constraint over the next token, advanced one token at a time (one per sequence: it keeps the
/// state of the text generated so far). Implementations: src/grammar/ (JSON, JSON Schema).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  /// Sets the logits of every token that may not come next to -inf: logits [V] float32, in place
  /// (any device). When complete() is true only the end-of-sequence ids stay allowed.
  virtual void mask(at::Tensor& logits) = 0;
  /// Advances the state with the token that was sampled. Throws hearth::Error for a token that
  /// mask() did not allow (a bug in the caller: it sampled outside the mask).
  virtual void accept(int64_t token) = 0;
  /// True when the text so far is a complete value and nothing but an end-of-sequence id may follow.
  virtual bool complete() const = 0;
};

}  // namespace hearth::generate
