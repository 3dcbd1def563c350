// RecurrentCache: holds the latest conv window and recurrent state; snapshots by deep copy.
#include "cache/recurrent_cache.h"

#include "core/error.h"

namespace hearth::cache {

int64_t RecurrentCache::trim(int64_t) { return 0; }

int64_t RecurrentCache::nbytes() const {
  return (conv_state_.defined() ? conv_state_.nbytes() : 0) +
         (recurrent_state_.defined() ? recurrent_state_.nbytes() : 0);
}

std::unique_ptr<LayerCache> RecurrentCache::clone() const {
  auto c = std::make_unique<RecurrentCache>();
  c->offset_ = offset_;
  if (conv_state_.defined()) c->conv_state_ = conv_state_.clone();
  if (recurrent_state_.defined()) c->recurrent_state_ = recurrent_state_.clone();
  return c;
}

void RecurrentCache::update(at::Tensor conv_state, at::Tensor recurrent_state, int64_t t) {
  HEARTH_CHECK(t >= 0, "recurrent cache: token count must be >= 0, got ", t);
  HEARTH_CHECK(conv_state.defined() && conv_state.dim() == 3, "recurrent cache: conv_state must be [B, convDim, W]");
  HEARTH_CHECK(recurrent_state.defined() && recurrent_state.dim() == 4 &&
                   recurrent_state.scalar_type() == at::kFloat,
               "recurrent cache: recurrent_state must be float32 [B, Hv, Dk, Dv], got ",
               recurrent_state.defined() ? recurrent_state.sizes() : at::IntArrayRef{}, " ",
               recurrent_state.defined() ? recurrent_state.scalar_type() : at::kFloat);
  if (conv_state_.defined())
    HEARTH_CHECK(conv_state_.sizes() == conv_state.sizes() && recurrent_state_.sizes() == recurrent_state.sizes(),
                 "recurrent cache: state shapes changed between calls (", conv_state_.sizes(), " → ",
                 conv_state.sizes(), ")");
  conv_state_ = std::move(conv_state);
  recurrent_state_ = std::move(recurrent_state);
  offset_ += t;
}

}  // namespace hearth::cache
