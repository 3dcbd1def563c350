// SlotRowsCache: prompt chunks written straight into decode-slot rows (see slot_rows_cache.h).
#include "generate/slot_rows_cache.h"

#include "core/error.h"

namespace hearth::generate {

class SlotRowsCache::Group final : public cache::KVCacheBase {
 public:
  Group(const SlotRowsCache& view, int64_t begin, int64_t count)
      : keys_(view.keys_), values_(view.values_), index_(view.slots_device_.narrow(0, begin, count)), begin_(begin),
        count_(count), offset_(view.offsets_[begin]) {}
  cache::KVView update(const at::Tensor& k, const at::Tensor& v) override {
    const int64_t T = k.size(2);
    HEARTH_CHECK(k.size(0) == count_ && v.size(0) == count_, "decode slots: a group of ", count_, " rows got k/v of ",
                 k.size(0), " rows");
    HEARTH_CHECK(offset_ + T <= keys_.size(2), "decode slots: a prefill chunk to position ", offset_ + T,
                 " passes the slots' ", keys_.size(2), " tokens");
    keys_.narrow(2, offset_, T).index_copy_(0, index_, k);
    values_.narrow(2, offset_, T).index_copy_(0, index_, v);
    return {keys_.narrow(2, 0, offset_ + T).index_select(0, index_),
            values_.narrow(2, 0, offset_ + T).index_select(0, index_), 0};
  }
  int64_t offset() const override { return offset_; }
  int64_t trim(int64_t) override { throw Error("decode slots: a prefill view is not trimmed"); }
  int64_t nbytes() const override { return 0; }  // the pool holds the memory
  std::string kind() const override { return "slot_rows"; }
  std::unique_ptr<cache::LayerCache> clone() const override {
    throw Error("decode slots: a prefill view is not cloned");
  }
  bool is(int64_t begin, int64_t count) const { return begin == begin_ && count == count_; }

 private:
  at::Tensor keys_, values_, index_;
  int64_t begin_, count_, offset_;
};

SlotRowsCache::SlotRowsCache(at::Tensor keys, at::Tensor values, std::vector<int64_t> slots, at::Tensor slots_device,
                             std::vector<int64_t> offsets)
    : RowsCache({}), keys_(std::move(keys)), values_(std::move(values)), slots_(std::move(slots)),
      slots_device_(std::move(slots_device)), offsets_(std::move(offsets)) {
  HEARTH_CHECK(slots_.size() == offsets_.size(), "decode slots: ", slots_.size(), " slots for ", offsets_.size(),
               " offsets");
  HEARTH_CHECK(slots_device_.dim() == 1 && slots_device_.size(0) == static_cast<int64_t>(slots_.size()) &&
                   slots_device_.scalar_type() == at::kLong && slots_device_.device() == keys_.device(),
               "decode slots: the device slot index must be int64 [", slots_.size(), "] on ", keys_.device());
}

SlotRowsCache::~SlotRowsCache() = default;

bool SlotRowsCache::groupable(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 1 || begin + count > batch()) return false;
  for (int64_t b = begin; b < begin + count; ++b)
    if (offsets_[b] != offsets_[begin]) return false;
  return true;
}

cache::KVCacheBase* SlotRowsCache::group(int64_t begin, int64_t count) {
  for (const auto& g : groups_)
    if (g->is(begin, count)) return g.get();
  HEARTH_CHECK(groupable(begin, count), "decode slots: rows [", begin, ", ", begin + count,
               ") of a prefill view are not at one position");
  groups_.push_back(std::make_unique<Group>(*this, begin, count));
  return groups_.back().get();
}

}  // namespace hearth::generate
