// Per-layer caches for generation: LayerCache (the common interface of every cache kind),
// KVCache (keys/values of every past token, grown in chunks) and RotatingKVCache (sliding
// window: only the last W-1 tokens are kept). The state cache of linear-attention layers is in
// recurrent_cache.h. Not the prompt/prefix cache across requests (prompt_cache.h).
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

namespace hearth::cache {

/// The state one layer keeps across forward calls. All layers of a model advance together.
class LayerCache {
 public:
  virtual ~LayerCache() = default;
  /// Tokens processed so far (the absolute position of the next token).
  virtual int64_t offset() const = 0;
  /// Removes up to `n` most recent tokens; returns how many were removed (a cache that has
  /// dropped old tokens may trim fewer, a recurrent cache none).
  virtual int64_t trim(int64_t n) = 0;
  /// Bytes of device memory held.
  virtual int64_t nbytes() const = 0;
  virtual std::string kind() const = 0;
  /// A deep copy (own buffers) holding the same tokens: a snapshot the prompt cache can keep while
  /// this cache goes on (the only way to go back on a cache that cannot trim).
  virtual std::unique_ptr<LayerCache> clone() const = 0;
};

/// Keys/values visible to the current queries: keys/values [B, Hkv, S, D], where keys[:, :, 0]
/// is the token at absolute position `pos0` (S may include tokens outside a sliding window: the
/// attention mask removes them).
struct KVView {
  at::Tensor keys, values;
  int64_t pos0 = 0;
};

/// A cache of attention keys/values.
class KVCacheBase : public LayerCache {
 public:
  /// Appends k/v [B, Hkv, T, D] (positions offset()..offset()+T-1) and returns the keys/values
  /// the new queries attend to. Throws hearth::Error if B/Hkv/D/dtype change between calls.
  virtual KVView update(const at::Tensor& k, const at::Tensor& v) = 0;
};

/// Every past token's keys/values in buffers [B, Hkv, capacity, D] grown `step` tokens at a time
/// (mlx-lm's KVCache). update() returns views, never copies the history.
class KVCache : public KVCacheBase {
 public:
  explicit KVCache(int64_t step = 256) : step_(step) {}
  KVView update(const at::Tensor& k, const at::Tensor& v) override;
  int64_t offset() const override { return offset_; }
  int64_t trim(int64_t n) override;
  int64_t nbytes() const override;
  std::string kind() const override { return "kv"; }
  std::unique_ptr<LayerCache> clone() const override;
  int64_t capacity() const { return keys_.defined() ? keys_.size(2) : 0; }
  /// The growth step: update() grows the buffers to offset() + T rounded up to a multiple of it.
  int64_t step() const { return step_; }
  /// Reallocates the buffers to offset() tokens rounded up to the growth step (at least one step)
  /// when they are larger (a copy), e.g. after a trim far back; the tokens are unchanged.
  void shrink_to_fit();
  /// The buffers [B, Hkv, capacity(), D] (undefined before the first update); tokens past
  /// offset() are stale.
  const at::Tensor& keys_buffer() const { return keys_; }
  const at::Tensor& values_buffer() const { return values_; }

 private:
  int64_t step_;
  int64_t offset_ = 0;
  at::Tensor keys_, values_;
};

/// Keys/values for a sliding-window layer of width W: keeps at least the last W-1 tokens (all a
/// new query can see besides itself), compacting its buffer when full, so memory stays
/// O(W + step) however long the sequence grows.
class RotatingKVCache : public KVCacheBase {
 public:
  explicit RotatingKVCache(int64_t window, int64_t step = 256);
  KVView update(const at::Tensor& k, const at::Tensor& v) override;
  int64_t offset() const override { return offset_; }
  /// Trims only as far as the remaining tokens still cover the window of the new last token.
  int64_t trim(int64_t n) override;
  int64_t nbytes() const override;
  std::string kind() const override { return "rotating_kv"; }
  std::unique_ptr<LayerCache> clone() const override;
  int64_t window() const { return window_; }
  /// Tokens the buffers [B, Hkv, capacity(), D] have room for (0 before the first update): after a
  /// T-token update, at least min(offset(), window() - 1) + T rounded up to the growth step, and
  /// never shrinking.
  int64_t capacity() const { return keys_.defined() ? keys_.size(2) : 0; }
  /// Reallocates the buffers to the tokens held rounded up to the growth step (at least one step)
  /// when they are larger (a copy); the tokens are unchanged.
  void shrink_to_fit();
  /// Absolute position of the oldest token held.
  int64_t start() const { return start_; }

 private:
  int64_t window_, step_;
  int64_t offset_ = 0;  // == start_ + used_
  int64_t start_ = 0;
  int64_t used_ = 0;
  at::Tensor keys_, values_;
};

/// One entry per layer, as a model's make_cache() returns them. An entry is null for a layer that
/// keeps no state of its own (Gemma 4's KV-sharing layers read an earlier layer's cache).
using Caches = std::vector<std::unique_ptr<LayerCache>>;

/// One layer's caches in a ragged batch (sequences decoding together in one step, each at its own
/// position with its own caches): rows[b] is row b's cache of this layer, not owned. A model that
/// takes ragged batches (Model::ragged_batches) updates each row's cache itself; it is never a
/// sequence's own state, so offset(), trim() and clone() throw hearth::Error.
class RowsCache : public LayerCache {
 public:
  explicit RowsCache(std::vector<LayerCache*> rows);
  ~RowsCache() override;
  int64_t offset() const override;
  int64_t trim(int64_t n) override;
  int64_t nbytes() const override;
  std::string kind() const override { return "rows"; }
  std::unique_ptr<LayerCache> clone() const override;
  const std::vector<LayerCache*>& rows() const { return rows_; }
  /// Rows of the batch this view covers.
  virtual int64_t batch() const { return static_cast<int64_t>(rows_.size()); }
  /// Row b's cache of this layer (may be null: a layer without state). Throws when b is out of range.
  virtual LayerCache* row(int64_t b);
  /// Whether rows [begin, begin + count) can be one group() view (grouped_kv here).
  virtual bool groupable(int64_t begin, int64_t count) const;
  /// Rows [begin, begin + count) as one KV cache of `count` rows (owned by this view, valid while it
  /// lives): update(k, v) with k/v [count, Hkv, T, D] appends row r's slice to row r's own cache
  /// and returns their keys/values side by side [count, Hkv, offset + T, D] (a copy; pos0 0), so a
  /// family attends to them in one call. Requires every row to be a KVCache at the same offset
  /// (see grouped_kv); throws hearth::Error otherwise or when the range is outside the rows.
  virtual KVCacheBase* group(int64_t begin, int64_t count);

 private:
  class Group;
  std::vector<LayerCache*> rows_;
  std::vector<std::unique_ptr<Group>> groups_;  // made by group(), reused per (begin, count)
};

/// Whether rows [begin, begin + count) of `c` (a RowsCache) can be one group() view: all of them
/// KVCache (growing, not sliding-window) at the same offset. False for any other cache kind.
bool grouped_kv(const LayerCache* c, int64_t begin, int64_t count);

/// Sum of nbytes() over the layers.
int64_t total_bytes(const Caches& caches);

/// The number of tokens the caches hold (the position of the next token): the common offset()
/// of the non-null entries, 0 when there are none. Throws hearth::Error when layers disagree.
int64_t offset_of(const Caches& caches);

/// Deep copies of every entry (null stays null): see LayerCache::clone.
Caches clone(const Caches& caches);

/// KVCache::shrink_to_fit / RotatingKVCache::shrink_to_fit on every layer of those kinds (the
/// others are left as they are): afterwards no buffer holds more than its tokens rounded up to the
/// growth step.
void shrink_to_fit(Caches& caches);

/// Removes the last `n` tokens from every layer. Returns false when some layer cannot trim exactly
/// `n` (a recurrent state, a sliding window that already dropped what is needed); the caches are
/// then inconsistent and must be discarded.
bool trim_all(Caches& caches, int64_t n);

/// The per-layer view of a ragged batch: entry i is a RowsCache over seqs[b]'s layer i (null when
/// every row's entry i is null). Every sequence must come from the same model's make_cache().
/// Throws hearth::Error when the sequences' layer counts differ or a layer is null in some rows only.
Caches rows_view(const std::vector<Caches*>& seqs);

}  // namespace hearth::cache
