// Prefill straight into decode slots (decode_slots.h): a ragged view (cache::RowsCache) whose rows
// are rows of a slot pool's KV buffers, so a padded batch of prompt chunks writes its keys/values
// where the rows will decode, with one scatter and one gather per layer for each run of rows at one
// position, instead of a growing cache per row that admit() then copies into the pool. Internal to
// src/generate/ (DecodeSlots::prefill_view makes them); not the decode step's static caches.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "cache/kv_cache.h"

namespace hearth::generate {

/// One layer of a prefill forward over pool rows. keys/values: the pool's buffers of the layer
/// [S, Hkv, C, D]; slots[b]: batch row b's slot, also as `slots_device` (int64 [B] on the buffers'
/// device, made once for every layer of the view: a host-to-device copy inside the forward would
/// wait for the layers queued before it); offsets[b]: the tokens its slot row holds (the
/// position of its chunk's first token). Rows are groupable when at one offset; group(begin, count)
/// is a KV cache of those rows whose update(k, v) (k/v [count, Hkv, T, D]) writes positions
/// [offset, offset + T) of their slot rows (index_copy_) and returns rows' keys/values [count, Hkv,
/// offset + T, D] (index_select: a copy; pos0 0). The padding of a padded chunk lands past the row's
/// prompt, where the decode step's masks hide it until its own tokens overwrite it. Throws
/// hearth::Error for a group whose rows sit at different offsets, outside the rows, or T past C.
class SlotRowsCache final : public cache::RowsCache {
 public:
  SlotRowsCache(at::Tensor keys, at::Tensor values, std::vector<int64_t> slots, at::Tensor slots_device,
                std::vector<int64_t> offsets);
  ~SlotRowsCache() override;
  int64_t batch() const override { return static_cast<int64_t>(slots_.size()); }
  cache::LayerCache* row(int64_t b) override { return group(b, 1); }
  bool groupable(int64_t begin, int64_t count) const override;
  cache::KVCacheBase* group(int64_t begin, int64_t count) override;

 private:
  class Group;
  at::Tensor keys_, values_;
  std::vector<int64_t> slots_;
  at::Tensor slots_device_;
  std::vector<int64_t> offsets_;
  std::vector<std::unique_ptr<Group>> groups_;
};

}  // namespace hearth::generate
