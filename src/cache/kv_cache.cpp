// KVCache (chunk-grown buffers) and RotatingKVCache (sliding window, compacting buffers).
#include "cache/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace hearth::cache {

namespace {

int64_t round_up(int64_t n, int64_t step) { return (n + step - 1) / step * step; }

void check_kv(const at::Tensor& k, const at::Tensor& v, const at::Tensor& buf) {
  HEARTH_CHECK(k.dim() == 4 && k.sizes() == v.sizes(), "kv cache: k/v must be [B, Hkv, T, D] alike, got ", k.sizes(),
               " and ", v.sizes());
  if (buf.defined())
    HEARTH_CHECK(buf.size(0) == k.size(0) && buf.size(1) == k.size(1) && buf.size(3) == k.size(3) &&
                     buf.scalar_type() == k.scalar_type(),
                 "kv cache: k ", k.sizes(), " ", k.scalar_type(), " does not match the cache's [", buf.size(0), ", ",
                 buf.size(1), ", *, ", buf.size(3), "] ", buf.scalar_type());
}

// A buffer [B, Hkv, capacity, D] holding the first `keep` tokens of `old` (if defined).
at::Tensor grow(const at::Tensor& like, const at::Tensor& old, int64_t keep, int64_t capacity) {
  at::Tensor buf = at::empty({like.size(0), like.size(1), capacity, like.size(3)}, like.options());
  if (old.defined() && keep > 0) buf.narrow(2, 0, keep).copy_(old.narrow(2, 0, keep));
  return buf;
}

}  // namespace

KVView KVCache::update(const at::Tensor& k, const at::Tensor& v) {
  check_kv(k, v, keys_);
  const int64_t T = k.size(2);
  if (!keys_.defined() || offset_ + T > keys_.size(2)) {
    const int64_t cap = round_up(offset_ + T, step_);
    keys_ = grow(k, keys_, offset_, cap);
    values_ = grow(v, values_, offset_, cap);
  }
  keys_.narrow(2, offset_, T).copy_(k);
  values_.narrow(2, offset_, T).copy_(v);
  offset_ += T;
  return {keys_.narrow(2, 0, offset_), values_.narrow(2, 0, offset_), 0};
}

int64_t KVCache::trim(int64_t n) {
  const int64_t t = std::min(std::max<int64_t>(n, 0), offset_);
  offset_ -= t;
  return t;
}

void KVCache::shrink_to_fit() {
  const int64_t cap = round_up(std::max<int64_t>(offset_, 1), step_);
  if (!keys_.defined() || cap >= keys_.size(2)) return;
  keys_ = grow(keys_, keys_, offset_, cap);
  values_ = grow(values_, values_, offset_, cap);
}

std::unique_ptr<LayerCache> KVCache::clone() const {
  auto c = std::make_unique<KVCache>(step_);
  c->offset_ = offset_;
  if (keys_.defined()) {
    c->keys_ = keys_.clone();
    c->values_ = values_.clone();
  }
  return c;
}

int64_t KVCache::nbytes() const { return keys_.defined() ? keys_.nbytes() + values_.nbytes() : 0; }

RotatingKVCache::RotatingKVCache(int64_t window, int64_t step) : window_(window), step_(step) {
  HEARTH_CHECK(window > 0, "RotatingKVCache: window must be positive, got ", window);
}

KVView RotatingKVCache::update(const at::Tensor& k, const at::Tensor& v) {
  check_kv(k, v, keys_);
  const int64_t T = k.size(2);
  if (!keys_.defined() || used_ + T > keys_.size(2)) {
    // Drop what no future query can see: keep the last window-1 tokens.
    const int64_t keep = std::min(used_, window_ - 1);
    const int64_t drop = used_ - keep;
    const int64_t cap = std::max<int64_t>(keys_.defined() ? keys_.size(2) : 0, round_up(keep + T, step_));
    at::Tensor kept_k, kept_v;
    if (keep > 0) {
      kept_k = keys_.narrow(2, drop, keep).clone();
      kept_v = values_.narrow(2, drop, keep).clone();
    }
    if (!keys_.defined() || cap > keys_.size(2)) {
      keys_ = at::empty({k.size(0), k.size(1), cap, k.size(3)}, k.options());
      values_ = at::empty({v.size(0), v.size(1), cap, v.size(3)}, v.options());
    }
    if (keep > 0) {
      keys_.narrow(2, 0, keep).copy_(kept_k);
      values_.narrow(2, 0, keep).copy_(kept_v);
    }
    start_ += drop;
    used_ = keep;
  }
  keys_.narrow(2, used_, T).copy_(k);
  values_.narrow(2, used_, T).copy_(v);
  used_ += T;
  offset_ += T;
  return {keys_.narrow(2, 0, used_), values_.narrow(2, 0, used_), start_};
}

int64_t RotatingKVCache::trim(int64_t n) {
  // After trimming to offset o, the next query (at o) needs keys from max(0, o - window + 1).
  int64_t t = std::min(std::max<int64_t>(n, 0), used_);
  while (t > 0 && start_ > std::max<int64_t>(0, offset_ - t - window_ + 1)) --t;
  used_ -= t;
  offset_ -= t;
  return t;
}

void RotatingKVCache::shrink_to_fit() {
  const int64_t cap = round_up(std::max<int64_t>(used_, 1), step_);
  if (!keys_.defined() || cap >= keys_.size(2)) return;
  keys_ = grow(keys_, keys_, used_, cap);
  values_ = grow(values_, values_, used_, cap);
}

void shrink_to_fit(Caches& caches) {
  for (auto& c : caches) {
    if (auto* kv = dynamic_cast<KVCache*>(c.get())) kv->shrink_to_fit();
    else if (auto* rot = dynamic_cast<RotatingKVCache*>(c.get())) rot->shrink_to_fit();
  }
}

int64_t RotatingKVCache::nbytes() const { return keys_.defined() ? keys_.nbytes() + values_.nbytes() : 0; }

int64_t total_bytes(const Caches& caches) {
  int64_t n = 0;
  for (const auto& c : caches) n += c ? c->nbytes() : 0;
  return n;
}

std::unique_ptr<LayerCache> RotatingKVCache::clone() const {
  auto c = std::make_unique<RotatingKVCache>(window_, step_);
  c->offset_ = offset_;
  c->start_ = start_;
  c->used_ = used_;
  if (keys_.defined()) {
    c->keys_ = keys_.clone();
    c->values_ = values_.clone();
  }
  return c;
}

int64_t offset_of(const Caches& caches) {
  int64_t offset = -1;
  for (size_t i = 0; i < caches.size(); ++i) {
    if (!caches[i]) continue;
    if (offset < 0) offset = caches[i]->offset();
    HEARTH_CHECK(caches[i]->offset() == offset, "caches: layer ", i, " holds ", caches[i]->offset(),
                 " tokens, an earlier layer ", offset);
  }
  return offset < 0 ? 0 : offset;
}

Caches clone(const Caches& caches) {
  Caches out;
  out.reserve(caches.size());
  for (const auto& c : caches) out.push_back(c ? c->clone() : nullptr);
  return out;
}

bool trim_all(Caches& caches, int64_t n) {
  bool exact = true;
  for (auto& c : caches)
    if (c && c->trim(n) != n) exact = false;
  return exact;
}

// RowsCache::group's view: the rows' own KVCaches appended one by one, read back side by side.
class RowsCache::Group final : public KVCacheBase {
 public:
  Group(std::vector<KVCache*> rows, int64_t begin) : rows_(std::move(rows)), begin_(begin) {}
  KVView update(const at::Tensor& k, const at::Tensor& v) override {
    const int64_t n = static_cast<int64_t>(rows_.size());
    HEARTH_CHECK(k.size(0) == n && v.size(0) == n, "RowsCache: a group of ", n, " rows got k/v of ", k.size(0),
                 " rows");
    std::vector<at::Tensor> keys, values;
    for (int64_t r = 0; r < n; ++r) {
      KVView one = rows_[r]->update(k.narrow(0, r, 1), v.narrow(0, r, 1));
      keys.push_back(one.keys);
      values.push_back(one.values);
    }
    return {at::cat(keys, 0), at::cat(values, 0), 0};
  }
  int64_t offset() const override { return rows_.front()->offset(); }
  int64_t trim(int64_t) override { throw Error("RowsCache: trim each row's own cache"); }
  int64_t nbytes() const override { return 0; }  // the rows' caches hold the memory
  std::string kind() const override { return "rows_group"; }
  std::unique_ptr<LayerCache> clone() const override { throw Error("RowsCache: clone each row's own cache"); }
  int64_t begin() const { return begin_; }
  int64_t count() const { return static_cast<int64_t>(rows_.size()); }

 private:
  std::vector<KVCache*> rows_;
  int64_t begin_;
};

RowsCache::RowsCache(std::vector<LayerCache*> rows) : rows_(std::move(rows)) {}
RowsCache::~RowsCache() = default;

bool grouped_kv(const LayerCache* c, int64_t begin, int64_t count) {
  const auto* rc = dynamic_cast<const RowsCache*>(c);
  if (!rc || begin < 0 || count < 1 || begin + count > static_cast<int64_t>(rc->rows().size())) return false;
  const auto* first = dynamic_cast<const KVCache*>(rc->rows()[begin]);
  if (!first) return false;
  for (int64_t r = begin; r < begin + count; ++r) {
    const auto* kv = dynamic_cast<const KVCache*>(rc->rows()[r]);
    if (!kv || kv->offset() != first->offset()) return false;
  }
  return true;
}

LayerCache* RowsCache::row(int64_t b) { return rows_.at(static_cast<size_t>(b)); }

bool RowsCache::groupable(int64_t begin, int64_t count) const { return grouped_kv(this, begin, count); }

KVCacheBase* RowsCache::group(int64_t begin, int64_t count) {
  for (const auto& g : groups_)
    if (g->begin() == begin && g->count() == count) return g.get();
  HEARTH_CHECK(grouped_kv(this, begin, count), "RowsCache: rows [", begin, ", ", begin + count,
               ") are not growing KV caches at one offset");
  std::vector<KVCache*> rows;
  for (int64_t r = begin; r < begin + count; ++r) rows.push_back(static_cast<KVCache*>(rows_[r]));
  groups_.push_back(std::make_unique<Group>(std::move(rows), begin));
  return groups_.back().get();
}

int64_t RowsCache::offset() const {
  throw Error("RowsCache: a ragged batch has no single offset (each row's cache has its own)");
}
int64_t RowsCache::trim(int64_t) { throw Error("RowsCache: trim each row's own cache"); }
std::unique_ptr<LayerCache> RowsCache::clone() const { throw Error("RowsCache: clone each row's own cache"); }
int64_t RowsCache::nbytes() const {
  int64_t n = 0;
  for (const LayerCache* r : rows_) n += r ? r->nbytes() : 0;
  return n;
}

Caches rows_view(const std::vector<Caches*>& seqs) {
  HEARTH_CHECK(!seqs.empty(), "rows_view: no sequences");
  const size_t L = seqs.front()->size();
  Caches out(L);
  for (size_t i = 0; i < L; ++i) {
    std::vector<LayerCache*> rows;
    for (Caches* c : seqs) {
      HEARTH_CHECK(c->size() == L, "rows_view: sequences with ", L, " and ", c->size(), " layers of caches");
      rows.push_back((*c)[i].get());
    }
    const size_t nulls = std::count(rows.begin(), rows.end(), nullptr);
    HEARTH_CHECK(nulls == 0 || nulls == rows.size(), "rows_view: layer ", i, " has a cache in some rows only");
    if (nulls == 0) out[i] = std::make_unique<RowsCache>(std::move(rows));
  }
  return out;
}

}  // namespace hearth::cache
