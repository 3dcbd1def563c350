// StaticKVCache: fixed buffers written at device-held positions (graph-capturable decode).
#include "cache/static_kv_cache.h"

#include "core/error.h"

namespace hearth::cache {

StaticKVCache::StaticKVCache(std::shared_ptr<StaticState> state, const KVCache& from) : state_(std::move(state)) {
  const at::Tensor& k = from.keys_buffer();
  HEARTH_CHECK(k.defined(), "StaticKVCache: the cache to copy is empty");
  const int64_t n = from.offset();
  HEARTH_CHECK(n == state_->host_offset && n < state_->capacity, "StaticKVCache: ", n, " cached tokens for ",
               state_->host_offset, " expected and a capacity of ", state_->capacity);
  auto alloc = [&](const at::Tensor& src) {
    at::Tensor buf = at::zeros({src.size(0), src.size(1), state_->capacity, src.size(3)}, src.options());
    buf.narrow(2, 0, n).copy_(src.narrow(2, 0, n));
    return buf;
  };
  keys_ = alloc(k);
  values_ = alloc(from.values_buffer());
}

KVView StaticKVCache::update(const at::Tensor& k, const at::Tensor& v) {
  const int64_t B = keys_.size(0), H = keys_.size(1), S = keys_.size(2), D = keys_.size(3);
  HEARTH_CHECK(k.dim() == 4 && k.size(0) == B && k.size(1) == H && k.size(2) == 1 && k.size(3) == D &&
                   v.sizes() == k.sizes(),
               "StaticKVCache: update takes one token per row, [", B, ", ", H, ", 1, ", D, "], got ", k.sizes());
  // Flat row index of (b, h, positions[b]) in the [B·H·S, D] view of the buffers.
  auto lopt = at::TensorOptions().dtype(at::kLong).device(keys_.device());
  at::Tensor base = (at::arange(B * H, lopt) * S).view({B, H});
  at::Tensor idx = (base + state_->positions.view({B, 1})).reshape({B * H});
  keys_.view({B * H * S, D}).index_copy_(0, idx, k.reshape({B * H, D}).to(keys_.scalar_type()));
  values_.view({B * H * S, D}).index_copy_(0, idx, v.reshape({B * H, D}).to(values_.scalar_type()));
  return {keys_, values_, 0};
}

int64_t StaticKVCache::trim(int64_t) { return 0; }

std::unique_ptr<LayerCache> StaticKVCache::clone() const {
  throw Error("StaticKVCache: a static cache is not snapshotted; convert it with to_kv_cache first");
}

std::unique_ptr<KVCache> StaticKVCache::to_kv_cache(int64_t n) const {
  HEARTH_CHECK(n >= 0 && n <= keys_.size(2), "StaticKVCache: ", n, " tokens asked of a capacity of ", keys_.size(2));
  auto c = std::make_unique<KVCache>();
  if (n > 0) c->update(keys_.narrow(2, 0, n), values_.narrow(2, 0, n));
  return c;
}

}  // namespace hearth::cache
