// The static form of a linear-attention layer's state cache (cache/recurrent_cache.h) for a
// captured (CUDA-graph) decode step: the conv window and recurrent state live in buffers whose
// addresses never change, overwritten in place each step, so the step can be recorded once and
// replayed. Not the growing caches of prefill and the eager path, from which it is filled.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "cache/recurrent_cache.h"
#include "cache/static_kv_cache.h"

namespace hearth::cache {

/// A RecurrentCache whose tensors are fixed buffers: conv_state [B, convDim, W] and the float32
/// recurrent_state [B, Hv, Dk, Dv] (shapes as RecurrentCache). write() copies a step's new states
/// into them (no allocation, no host sync); offset() is the runner's StaticState::host_offset,
/// since a replayed step does not run host code. A family's one-token step checks for this type
/// and calls write() instead of update().
class StaticRecurrentCache : public RecurrentCache {
 public:
  /// Copies `from` (a filled RecurrentCache holding state.host_offset tokens) into new buffers.
  /// Throws hearth::Error when `from` is empty or holds another number of tokens.
  StaticRecurrentCache(std::shared_ptr<StaticState> state, const RecurrentCache& from);
  /// A view over pool buffers conv [S, convDim, W] and float32 recurrent [S, Hv, Dk, Dv] (owned by
  /// the caller, who keeps them alive): rows [0, B), B = state.positions.numel() (generate/
  /// decode_slots.h). write() lands in the pool. Throws hearth::Error when B > S or the recurrent
  /// buffer is not float32.
  StaticRecurrentCache(std::shared_ptr<StaticState> state, const at::Tensor& pool_conv, const at::Tensor& pool_recurrent);
  /// Copies `from` (a filled RecurrentCache of one row) into row `row` of these buffers. Throws
  /// hearth::Error when the row or the shapes do not fit.
  void write_row(int64_t row, const RecurrentCache& from);
  /// Row `row`'s states as an ordinary RecurrentCache of one row holding `n` tokens (a copy).
  std::unique_ptr<RecurrentCache> read_row(int64_t row, int64_t n) const;
  /// Overwrites both buffers with a step's new states (shapes and dtypes as held; throws
  /// hearth::Error otherwise — checked on the host, outside any device work).
  void write(const at::Tensor& conv_state, const at::Tensor& recurrent_state);
  int64_t offset() const override { return state_->host_offset; }
  std::string kind() const override { return "static_recurrent"; }
  std::unique_ptr<LayerCache> clone() const override;
  /// The buffers as an ordinary RecurrentCache holding `n` tokens (back to the eager path; the
  /// tensors are copied, so the static buffers can be reused).
  std::unique_ptr<RecurrentCache> to_recurrent_cache(int64_t n) const;
  const std::shared_ptr<StaticState>& state() const { return state_; }

 private:
  std::shared_ptr<StaticState> state_;
};

}  // namespace hearth::cache
