// The prompt (prefix) cache across requests: a small LRU, bounded by bytes, of per-layer caches
// together with the token ids they hold, keyed by a namespace (the adapter selection). A new
// request reuses the entry sharing the longest common prefix (mlx-lm's LRUPromptCache, mlx-bun's
// PromptCache). Not the per-layer caches themselves (kv_cache.h) and not thread-safe: the server
// touches it from its one engine thread only.
#pragma once
#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include "cache/kv_cache.h"

namespace hearth::cache {

/// What take() hands back: caches holding the first `cached` prompt tokens (empty caches and 0 on
/// a miss).
struct PromptCacheHit {
  Caches caches;
  int64_t cached = 0;
};

/// Counters for logs and /stats.
struct PromptCacheStats {
  int64_t entries = 0, bytes = 0, max_bytes = 0, hits = 0, misses = 0;
};

class PromptCache {
 public:
  /// `max_bytes` > 0: the sum of the entries' cache bytes (LayerCache::nbytes) it keeps.
  /// Throws hearth::Error when max_bytes <= 0 (a disabled cache is no PromptCache at all).
  explicit PromptCache(int64_t max_bytes);

  /// Among the entries of namespace `ns`, the one whose tokens share the longest common prefix p
  /// with `prompt`, capped at prompt.size() - 1 (at least one prompt token must still run to give
  /// logits). When p > 1 the entry is removed, its caches trimmed to p tokens and returned (a single
  /// shared token, usually BOS, is a miss: it would take away an entry that saves its owner more). A
  /// cache that cannot trim exactly that far (a sliding-window cache that already dropped the
  /// tokens the new position needs, see RotatingKVCache::trim) makes it a miss, and the entry is
  /// discarded (it is no longer consistent). Entries of other namespaces are never used.
  /// Entries holding a layer of kind "recurrent" (hybrid models; such a state cannot trim) are
  /// snapshots: usable only when all their tokens are a prefix of `prompt` (p = their length), the
  /// longest usable entry wins, and a snapshot is handed out as a clone() while it stays cached
  /// (most recently used), so later requests sharing it resume from it too. The caches handed out
  /// hold buffers no larger than their tokens rounded up to the growth step (shrink_to_fit), so a
  /// hit holds no more than a fresh prefill of the same tokens would.
  PromptCacheHit take(const std::string& ns, const std::vector<int64_t>& prompt);

  /// Stores `caches` holding exactly `tokens` (caches[i]->offset() == tokens.size(); throws
  /// hearth::Error otherwise) as the most recent entry of `ns` (replacing an entry of `ns` holding
  /// the same tokens), then evicts least recently used entries while over max_bytes. An entry alone
  /// larger than max_bytes is not stored.
  void put(const std::string& ns, std::vector<int64_t> tokens, Caches caches);

  /// Drops every entry whose namespace `pred` accepts (e.g. those selecting an unmounted adapter).
  template <class Pred>
  void drop_if(Pred pred) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (pred(it->ns)) {
        bytes_ -= it->bytes;
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }

  PromptCacheStats stats() const;

 private:
  struct Entry {
    std::string ns;
    std::vector<int64_t> tokens;
    Caches caches;
    int64_t bytes = 0;
  };
  int64_t max_bytes_;
  int64_t bytes_ = 0;
  int64_t hits_ = 0, misses_ = 0;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace hearth::cache
