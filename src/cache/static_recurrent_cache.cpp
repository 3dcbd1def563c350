// StaticRecurrentCache: a recurrent state overwritten in place (graph-capturable decode).
#include "cache/static_recurrent_cache.h"

#include "core/error.h"

namespace hearth::cache {

StaticRecurrentCache::StaticRecurrentCache(std::shared_ptr<StaticState> state, const RecurrentCache& from)
    : state_(std::move(state)) {
  HEARTH_CHECK(from.conv_state().defined(), "StaticRecurrentCache: the cache to copy is empty");
  HEARTH_CHECK(from.offset() == state_->host_offset, "StaticRecurrentCache: ", from.offset(), " tokens seen, ",
               state_->host_offset, " expected");
  update(from.conv_state().clone(), from.recurrent_state().clone(), from.offset());
}

StaticRecurrentCache::StaticRecurrentCache(std::shared_ptr<StaticState> state, const at::Tensor& conv,
                                           const at::Tensor& recurrent)
    : state_(std::move(state)) {
  const int64_t B = state_->positions.defined() ? state_->positions.numel() : 0;
  HEARTH_CHECK(conv.defined() && recurrent.defined() && conv.dim() == 3 && recurrent.dim() == 4 &&
                   conv.size(0) == recurrent.size(0) && B >= 1 && B <= conv.size(0),
               "StaticRecurrentCache: a window of ", B, " rows does not fit pool buffers ",
               conv.defined() ? conv.sizes() : at::IntArrayRef{}, " and ",
               recurrent.defined() ? recurrent.sizes() : at::IntArrayRef{});
  update(conv.narrow(0, 0, B), recurrent.narrow(0, 0, B), 0);
}

void StaticRecurrentCache::write_row(int64_t row, const RecurrentCache& from) {
  HEARTH_CHECK(from.conv_state().defined() && from.conv_state().size(0) == 1 && row >= 0 &&
                   row < conv_state().size(0) && from.conv_state().sizes().slice(1) == conv_state().sizes().slice(1) &&
                   from.recurrent_state().sizes().slice(1) == recurrent_state().sizes().slice(1),
               "StaticRecurrentCache: a one-row state does not fit row ", row, " of ", conv_state().sizes(), " and ",
               recurrent_state().sizes());
  conv_state()[row].copy_(from.conv_state()[0]);
  recurrent_state()[row].copy_(from.recurrent_state()[0]);
}

std::unique_ptr<RecurrentCache> StaticRecurrentCache::read_row(int64_t row, int64_t n) const {
  HEARTH_CHECK(row >= 0 && row < conv_state().size(0), "StaticRecurrentCache: row ", row, " of ", conv_state().size(0));
  auto c = std::make_unique<RecurrentCache>();
  c->update(conv_state().narrow(0, row, 1).clone(), recurrent_state().narrow(0, row, 1).clone(), n);
  return c;
}

void StaticRecurrentCache::write(const at::Tensor& conv, const at::Tensor& recurrent) {
  HEARTH_CHECK(conv.sizes() == conv_state().sizes() && recurrent.sizes() == recurrent_state().sizes() &&
                   recurrent.scalar_type() == at::kFloat,
               "StaticRecurrentCache: a step's states must keep their shapes ", conv_state().sizes(), " and float32 ",
               recurrent_state().sizes(), ", got ", conv.sizes(), " and ", recurrent.scalar_type(), " ",
               recurrent.sizes());
  conv_state().copy_(conv);
  recurrent_state().copy_(recurrent);
}

std::unique_ptr<LayerCache> StaticRecurrentCache::clone() const { return to_recurrent_cache(offset()); }

std::unique_ptr<RecurrentCache> StaticRecurrentCache::to_recurrent_cache(int64_t n) const {
  auto c = std::make_unique<RecurrentCache>();
  c->update(conv_state().clone(), recurrent_state().clone(), n);
  return c;
}

}  // namespace hearth::cache
