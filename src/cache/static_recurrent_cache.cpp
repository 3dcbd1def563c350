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
