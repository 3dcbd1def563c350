// The state cache of a linear-attention layer (Qwen3.5's gated DeltaNet): the causal conv1d's
// window of past inputs and the recurrent state matrix. Constant size whatever the sequence
// length; it cannot be trimmed (the prompt cache keeps clone()d snapshots instead). Not the KV
// caches of attention layers (kv_cache.h); the layer's math lives in its model family.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "cache/kv_cache.h"

namespace hearth::cache {

/// conv_state [B, convDim, W] (the last W inputs of the depthwise causal conv, oldest first, in the
/// model's dtype; W = K-1 for Qwen3.5, as mlx-lm keeps it) and
/// recurrent_state [B, Hv, Dk, Dv] float32 (transformers' recurrent_states). Both undefined
/// until the first update. offset() counts tokens seen.
class RecurrentCache : public LayerCache {
 public:
  RecurrentCache() = default;
  int64_t offset() const override { return offset_; }
  /// Only trim(0) succeeds: a recurrent state cannot forget tokens. Returns 0.
  int64_t trim(int64_t n) override;
  int64_t nbytes() const override;
  std::string kind() const override { return "recurrent"; }
  std::unique_ptr<LayerCache> clone() const override;

  const at::Tensor& conv_state() const { return conv_state_; }
  const at::Tensor& recurrent_state() const { return recurrent_state_; }
  /// Replaces both states after a forward of `t` new tokens. Throws hearth::Error when t < 0, when
  /// the recurrent state is not float32, or when shapes change between calls (batch, dims).
  void update(at::Tensor conv_state, at::Tensor recurrent_state, int64_t t);

 private:
  at::Tensor conv_state_, recurrent_state_;
  int64_t offset_ = 0;
};

}  // namespace hearth::cache
