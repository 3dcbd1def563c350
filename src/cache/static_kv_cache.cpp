// StaticKVCache: fixed buffers written at device-held positions (graph-capturable decode).
#include "cache/static_kv_cache.h"

#include <algorithm>

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
  flat_keys_ = keys_.view({-1, keys_.size(3)});
  flat_values_ = values_.view({-1, values_.size(3)});
  row_stride_ = state_->capacity;
}

StaticKVCache::StaticKVCache(std::shared_ptr<StaticState> state, const at::Tensor& pk, const at::Tensor& pv)
    : state_(std::move(state)) {
  HEARTH_CHECK(pk.defined() && pk.dim() == 4 && pk.is_contiguous() && pv.sizes() == pk.sizes() && pv.is_contiguous(),
               "StaticKVCache: pool buffers must be two contiguous [S, Hkv, C, D] tensors of one shape");
  const int64_t B = state_->positions.defined() ? state_->positions.numel() : 0;
  HEARTH_CHECK(B >= 1 && B <= pk.size(0) && state_->capacity >= 1 && state_->capacity <= pk.size(2),
               "StaticKVCache: a window of ", B, " rows and ", state_->capacity, " tokens does not fit a pool of ",
               pk.size(0), " rows and ", pk.size(2), " tokens");
  keys_ = pk.narrow(0, 0, B).narrow(2, 0, state_->capacity);
  values_ = pv.narrow(0, 0, B).narrow(2, 0, state_->capacity);
  flat_keys_ = pk.view({-1, pk.size(3)});
  flat_values_ = pv.view({-1, pv.size(3)});
  row_stride_ = pk.size(2);
}

void StaticKVCache::write_row(int64_t row, const KVCache& from) {
  const at::Tensor& k = from.keys_buffer();
  const int64_t n = from.offset();
  HEARTH_CHECK(k.defined() && k.size(0) == 1, "StaticKVCache: write_row takes a filled cache of one row");
  HEARTH_CHECK(row >= 0 && row < keys_.size(0) && n <= keys_.size(2) && k.size(1) == keys_.size(1) &&
                   k.size(3) == keys_.size(3),
               "StaticKVCache: ", n, " tokens of shape ", k.sizes(), " do not fit row ", row, " of ", keys_.sizes());
  keys_[row].narrow(1, 0, n).copy_(k[0].narrow(1, 0, n));
  values_[row].narrow(1, 0, n).copy_(from.values_buffer()[0].narrow(1, 0, n));
}

std::unique_ptr<KVCache> StaticKVCache::read_row(int64_t row, int64_t n) const {
  HEARTH_CHECK(row >= 0 && row < keys_.size(0) && n >= 0 && n <= keys_.size(2), "StaticKVCache: row ", row,
               " and ", n, " tokens asked of ", keys_.sizes());
  auto c = std::make_unique<KVCache>();
  if (n > 0) c->update(keys_.narrow(0, row, 1).narrow(2, 0, n), values_.narrow(0, row, 1).narrow(2, 0, n));
  return c;
}

namespace {
// The tokens a sliding-window cache holds: (keys, values [1, H, n, D], position of the oldest), read
// through a zero-token update of a copy (the cache does not expose its buffers; such an update
// returns what it holds and changes nothing). `like` [*, H, *, D] gives the heads, head dim and
// dtype the cache must have (its update throws hearth::Error when they differ).
KVView held_tokens(const RotatingKVCache& from, const at::Tensor& like) {
  auto copy = from.clone();
  at::Tensor none = at::empty({1, like.size(1), 0, like.size(3)}, like.options());
  return static_cast<RotatingKVCache&>(*copy).update(none, none);
}
}  // namespace

void StaticKVCache::write_row(int64_t row, const RotatingKVCache& from) {
  HEARTH_CHECK(keys_.defined() && row >= 0 && row < keys_.size(0), "StaticKVCache: write_row to row ", row, " of ",
               keys_.defined() ? keys_.size(0) : 0);
  HEARTH_CHECK(from.offset() > 0 && from.offset() <= keys_.size(2), "StaticKVCache: a sliding-window cache of ",
               from.offset(), " tokens does not fit ", keys_.size(2), " positions");
  const KVView held = held_tokens(from, keys_);
  const int64_t n = held.keys.size(2);
  HEARTH_CHECK(held.keys.size(0) == 1 && held.pos0 + n == from.offset(), "StaticKVCache: the sliding-window cache ",
               "holds positions ", held.pos0, "..", held.pos0 + n - 1, " of ", held.keys.size(0), " rows, expected ",
               "one row up to ", from.offset() - 1);
  keys_[row].narrow(1, held.pos0, n).copy_(held.keys[0]);
  values_[row].narrow(1, held.pos0, n).copy_(held.values[0]);
}

void StaticKVCache::read_row(int64_t row, RotatingKVCache& to, int64_t n) const {
  const int64_t from = to.offset();
  HEARTH_CHECK(keys_.defined() && row >= 0 && row < keys_.size(0) && from <= n && n <= keys_.size(2),
               "StaticKVCache: cannot hand positions ", from, "..", n - 1, " of row ", row, " to a sliding-window ",
               "cache (", keys_.defined() ? keys_.size(0) : 0, " rows of ", keys_.defined() ? keys_.size(2) : 0,
               " positions)");
  const at::Tensor k = keys_.narrow(0, row, 1), v = values_.narrow(0, row, 1);
  for (int64_t p = from; p < n;) {
    const int64_t len = std::min(n - p, to.window());
    to.update(k.narrow(2, p, len), v.narrow(2, p, len));
    p += len;
  }
}

StaticKVCache::StaticKVCache(std::shared_ptr<StaticState> state, const RotatingKVCache& from)
    : state_(std::move(state)) {
  const int64_t n = from.offset();
  HEARTH_CHECK(n == state_->host_offset && n < state_->capacity, "StaticKVCache: ", n, " cached tokens for ",
               state_->host_offset, " expected and a capacity of ", state_->capacity);
  valid_from_ = from.start();
  pending_ = from.clone();
}

KVView StaticKVCache::update(const at::Tensor& k, const at::Tensor& v) {
  if (!keys_.defined() && pending_) {
    // A rotating cache's tokens, read through a zero-token update of its snapshot (which returns
    // what it holds and the position of the oldest), laid out by absolute position.
    auto& rc = static_cast<RotatingKVCache&>(*pending_);
    const KVView held = rc.update(k.narrow(2, 0, 0), v.narrow(2, 0, 0));
    const int64_t n = held.keys.size(2);
    HEARTH_CHECK(held.pos0 == valid_from_ && held.pos0 + n == state_->host_offset, "StaticKVCache: the rotating cache ",
                 "holds positions ", held.pos0, "..", held.pos0 + n - 1, ", expected ", valid_from_, "..",
                 state_->host_offset - 1);
    auto alloc = [&](const at::Tensor& src) {
      at::Tensor buf = at::zeros({src.size(0), src.size(1), state_->capacity, src.size(3)}, src.options());
      if (n > 0) buf.narrow(2, held.pos0, n).copy_(src);
      return buf;
    };
    keys_ = alloc(held.keys);
    values_ = alloc(held.values);
    flat_keys_ = keys_.view({-1, keys_.size(3)});
    flat_values_ = values_.view({-1, values_.size(3)});
    row_stride_ = state_->capacity;
    pending_.reset();
  }
  const int64_t B = keys_.size(0), H = keys_.size(1), S = keys_.size(2), D = keys_.size(3);
  HEARTH_CHECK(k.dim() == 4 && k.size(0) == B && k.size(1) == H && k.size(2) == 1 && k.size(3) == D &&
                   v.sizes() == k.sizes(),
               "StaticKVCache: update takes one token per row, [", B, ", ", H, ", 1, ", D, "], got ", k.sizes());
  (void)S;
  // Flat row index of (b, h, positions[b]) in the [rows·H·stride, D] view of the storage (rows
  // [0, B) come first in it, so a window's index is the same formula).
  auto lopt = at::TensorOptions().dtype(at::kLong).device(keys_.device());
  at::Tensor base = (at::arange(B * H, lopt) * row_stride_).view({B, H});
  at::Tensor idx = (base + state_->positions.view({B, 1})).reshape({B * H});
  flat_keys_.index_copy_(0, idx, k.reshape({B * H, D}).to(keys_.scalar_type()));
  flat_values_.index_copy_(0, idx, v.reshape({B * H, D}).to(values_.scalar_type()));
  return {keys_, values_, 0};
}

int64_t StaticKVCache::trim(int64_t) { return 0; }

std::unique_ptr<LayerCache> StaticKVCache::clone() const {
  throw Error("StaticKVCache: a static cache is not snapshotted; convert it with to_kv_cache first");
}

void StaticKVCache::extend(RotatingKVCache& to, int64_t n) const {
  const int64_t from = to.offset();
  HEARTH_CHECK(keys_.defined() && from >= valid_from_ && from <= n && n <= keys_.size(2), "StaticKVCache: cannot ",
               "hand positions ", from, "..", n - 1, " to a rotating cache (held: ", valid_from_, "..",
               keys_.defined() ? keys_.size(2) - 1 : -1, ")");
  for (int64_t p = from; p < n;) {
    const int64_t len = std::min(n - p, to.window());
    to.update(keys_.narrow(2, p, len), values_.narrow(2, p, len));
    p += len;
  }
}

std::unique_ptr<KVCache> StaticKVCache::to_kv_cache(int64_t n) const {
  HEARTH_CHECK(n >= 0 && n <= keys_.size(2), "StaticKVCache: ", n, " tokens asked of a capacity of ", keys_.size(2));
  auto c = std::make_unique<KVCache>();
  if (n > 0) c->update(keys_.narrow(2, 0, n), values_.narrow(2, 0, n));
  return c;
}

}  // namespace hearth::cache
