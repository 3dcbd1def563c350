// Static caches for a captured (CUDA-graph) decode step: preallocated key/value buffers of a fixed
// capacity whose addresses never change, written at positions held in a device tensor, so the
// whole one-token step can be recorded once and replayed (gpt-fast / vLLM style). Not the growing
// caches of kv_cache.h (prefill, the eager path), from which these are filled.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>

#include "cache/kv_cache.h"

namespace hearth::cache {

/// What every layer of a static step shares: the rows' positions as a device tensor (the only
/// per-step input besides the token ids) and what a family derives from them once per step.
struct StaticState {
  at::Tensor positions;  ///< [B] int64 on the model's device: the position of each row's new token
  int64_t capacity = 0;  ///< tokens each row's buffers hold (positions must stay below it)
  int64_t host_offset = 0;  ///< the runner's host-side mirror of positions (uniform rows), for offset()
  /// Set by the family at the start of each step (graph-safe device ops on `positions`): RoPE
  /// rows and additive masks [B, 1, 1, capacity] for full and sliding-window layers.
  at::Tensor cos, sin, mask_full;
  std::optional<at::Tensor> mask_window;
  at::Tensor cos_table, sin_table;  ///< [capacity, D] RoPE tables, computed once by the family
  /// Set by a family that ran its static path: a runner checks it after its first (eager) step and
  /// falls back to the eager loop when a family treated the static caches as ordinary ones.
  bool family_ran_static = false;
};

/// One layer's keys/values in fixed buffers [B, Hkv, capacity, D], token p at index p. update()
/// takes one token per row (k/v [B, Hkv, 1, D]) and writes it at state.positions[b] with device
/// indexing only (no host sync, no allocation that depends on the data), returning the whole
/// buffers (pos0 = 0; the family masks positions past each row's own with StaticState's masks).
///
/// The buffers may also be a window of a larger pool (generate/decode_slots.h: rows [0, B) and
/// tokens [0, capacity) of [S, Hkv, C, D]), so that one pool serves every (batch, length) bucket;
/// rows of the pool are filled from and read back into growing caches with write_row/read_row
/// (sliding-window caches too: by absolute position, as the constructor from one lays them out).
class StaticKVCache : public KVCacheBase {
 public:
  /// Copies `from` (a filled KVCache of B rows holding state.host_offset tokens) into new buffers
  /// of state.capacity tokens. Throws hearth::Error when the tokens do not fit.
  StaticKVCache(std::shared_ptr<StaticState> state, const KVCache& from);
  /// A sliding-window layer's cache as a full-capacity static one (memory: capacity tokens, not
  /// the window; the family hides what the window excludes with a window mask). The
  /// tokens `from` holds (positions from.start() .. state.host_offset-1) go to their absolute
  /// positions; earlier positions, which `from` already dropped, stay zero — the window mask hides
  /// them from every query at or past host_offset, since `from` keeps at least window-1 tokens.
  /// The buffers are made at the first update(), whose k/v give their shape and dtype (a rotating
  /// cache does not expose its buffers: a snapshot of `from` is read then and released), so that
  /// first step must run eagerly, not under capture (Sequence::run_static's first call does).
  /// Throws hearth::Error when the tokens do not fit; the first update() throws when its k/v do not
  /// match `from`'s batch, heads, head dim or dtype.
  StaticKVCache(std::shared_ptr<StaticState> state, const RotatingKVCache& from);
  /// A view over `pool_keys`/`pool_values` [S, Hkv, C, D] (contiguous, owned by the caller, who
  /// keeps them alive): rows [0, B) with B = state.positions.numel() and tokens [0, state.capacity).
  /// Writes land in the pool. Throws hearth::Error when B > S, capacity > C, or shapes differ.
  StaticKVCache(std::shared_ptr<StaticState> state, const at::Tensor& pool_keys, const at::Tensor& pool_values);
  /// Copies the `from.offset()` tokens of `from` (one row, [1, Hkv, n, D]) into row `row` of these
  /// buffers at positions [0, n) (the rest of the row is left as it was: the masks hide it).
  /// Throws hearth::Error when the row, the token count or the shapes do not fit.
  void write_row(int64_t row, const KVCache& from);
  /// Row `row`'s first `n` tokens as an ordinary growing cache of one row (a copy).
  std::unique_ptr<KVCache> read_row(int64_t row, int64_t n) const;
  /// A sliding-window layer's row (decode slots hold it by absolute position, like the constructor
  /// from a RotatingKVCache): copies the tokens `from` (one row) holds, positions from.start() ..
  /// from.offset()-1, into row `row` at those positions. The row's earlier positions are left as
  /// they were (stale but finite): the window mask hides them from every query at or past
  /// from.offset(), since `from` keeps at least window-1 tokens. `from` is not changed. Throws
  /// hearth::Error when the row or the positions do not fit, or the shapes or dtype differ.
  void write_row(int64_t row, const RotatingKVCache& from);
  /// Back to the sliding-window cache row `row` was filled from (write_row, `to` unchanged since):
  /// appends the row's positions to.offset() .. n-1 to `to` in updates of to.window() tokens, as
  /// extend() does for a whole cache, so `to` ends as the eager loop would leave it. Throws
  /// hearth::Error when the row does not exist or n is below to.offset() or past the buffers.
  void read_row(int64_t row, RotatingKVCache& to, int64_t n) const;
  KVView update(const at::Tensor& k, const at::Tensor& v) override;
  int64_t offset() const override { return state_->host_offset; }
  int64_t trim(int64_t n) override;  ///< 0: positions live on the device (the runner rewinds them)
  int64_t nbytes() const override { return keys_.defined() ? keys_.nbytes() + values_.nbytes() : 0; }
  std::string kind() const override { return "static_kv"; }
  std::unique_ptr<LayerCache> clone() const override;
  /// The buffers' first `n` tokens as an ordinary growing cache (back to the eager path).
  std::unique_ptr<KVCache> to_kv_cache(int64_t n) const;
  /// Back to a sliding-window cache: appends to `to` (the rotating cache this one was made from,
  /// unchanged since) the buffers' positions to.offset() .. n-1, in updates of to.window() tokens,
  /// so `to` ends as the eager loop would leave it (holding the last window-1 tokens or more; its
  /// buffer may grow to about twice the window). Throws hearth::Error when those positions are
  /// not all held here (to.offset() < valid_from() or > n, n > capacity, buffers not made yet).
  void extend(RotatingKVCache& to, int64_t n) const;
  /// The oldest position whose keys/values the buffers hold: 0, or from.start() for a cache made
  /// from a RotatingKVCache (positions before it are zeros, always masked).
  int64_t valid_from() const { return valid_from_; }
  /// The buffers [B, Hkv, capacity, D] (undefined until the first update() for a cache made from a
  /// RotatingKVCache): what a layer sharing this layer's keys/values (Gemma 4) attends over.
  const at::Tensor& keys() const { return keys_; }
  const at::Tensor& values() const { return values_; }
  /// The contiguous storage as [rows·Hkv·row_stride(), D]: token p of (row b, head h) at row
  /// (b·Hkv + h)·row_stride() + p — what a fused write indexes (nn::rope_cache_write). Undefined
  /// until the buffers are made, like keys().
  const at::Tensor& flat_keys() const { return flat_keys_; }
  const at::Tensor& flat_values() const { return flat_values_; }
  int64_t row_stride() const { return row_stride_; }
  const std::shared_ptr<StaticState>& state() const { return state_; }

 private:
  std::shared_ptr<StaticState> state_;
  at::Tensor keys_, values_;  // [B, Hkv, capacity, D] (a window of the flat buffers below)
  at::Tensor flat_keys_, flat_values_;  // the contiguous storage as [rows·Hkv·stride, D]
  int64_t row_stride_ = 0;              // tokens between two (row, head) pairs in the flat storage
  int64_t valid_from_ = 0;
  std::unique_ptr<LayerCache> pending_;  // a rotating cache's snapshot, read at the first update()
};

}  // namespace hearth::cache
