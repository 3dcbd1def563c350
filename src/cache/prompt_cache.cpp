// PromptCache: longest-common-prefix lookup per namespace, exact trim or miss, LRU by bytes.
// Entries holding an untrimmable (recurrent) layer are snapshots: usable only when all their tokens
// are a prefix of the prompt, handed out as clone()s while they stay cached (hybrid models).
#include "cache/prompt_cache.h"

#include <algorithm>

#include "core/error.h"

namespace hearth::cache {

PromptCache::PromptCache(int64_t max_bytes) : max_bytes_(max_bytes) {
  HEARTH_CHECK(max_bytes > 0, "prompt cache: max_bytes must be positive, got ", max_bytes);
}

namespace {
// Whether some layer keeps a state that cannot forget tokens (trim only by 0).
bool has_untrimmable(const Caches& caches) {
  for (const auto& c : caches)
    if (c && c->kind() == "recurrent") return true;
  return false;
}
}  // namespace

PromptCacheHit PromptCache::take(const std::string& ns, const std::vector<int64_t>& prompt) {
  const int64_t cap = static_cast<int64_t>(prompt.size()) - 1;
  auto best = entries_.end();
  int64_t best_p = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->ns != ns) continue;
    const size_t n = std::min(it->tokens.size(), prompt.size());
    int64_t p = std::min<int64_t>(
        cap, std::mismatch(it->tokens.begin(), it->tokens.begin() + n, prompt.begin()).first - it->tokens.begin());
    if (has_untrimmable(it->caches) && p != static_cast<int64_t>(it->tokens.size())) p = 0;  // a snapshot: whole only
    if (p > best_p) {
      best_p = p;
      best = it;
    }
  }
  PromptCacheHit hit;
  // One shared token (usually BOS) is a miss: taking an entry moves it out, so a hit that saves one
  // token would rob the request that continues that entry (as llama.cpp's server reuses a slot's
  // cache only above a prompt similarity).
  if (best == entries_.end() || best_p < 2) {
    ++misses_;
    return hit;
  }
  if (has_untrimmable(best->caches)) {  // a snapshot: hand out a copy; it stays, now most recently used
    entries_.splice(entries_.begin(), entries_, best);
    ++hits_;
    hit.caches = clone(entries_.front().caches);
    shrink_to_fit(hit.caches);
    hit.cached = best_p;
    return hit;
  }
  Entry e = std::move(*best);
  bytes_ -= e.bytes;
  entries_.erase(best);
  if (!trim_all(e.caches, offset_of(e.caches) - best_p)) {  // cannot reach exactly p tokens: discard, start fresh
    ++misses_;
    return hit;
  }
  ++hits_;
  // A request grown longer than this prompt left buffers the new request is not charged for.
  shrink_to_fit(e.caches);
  hit.caches = std::move(e.caches);
  hit.cached = best_p;
  return hit;
}

void PromptCache::put(const std::string& ns, std::vector<int64_t> tokens, Caches caches) {
  const int64_t held = offset_of(caches);
  HEARTH_CHECK(held == static_cast<int64_t>(tokens.size()), "prompt cache: the layer caches hold ", held,
               " tokens, but the entry has ", tokens.size());
  Entry e{ns, std::move(tokens), std::move(caches), 0};
  e.bytes = total_bytes(e.caches);
  if (e.bytes > max_bytes_ || e.tokens.empty()) return;
  for (auto it = entries_.begin(); it != entries_.end(); ++it)  // same tokens: replaced, not duplicated
    if (it->ns == e.ns && it->tokens == e.tokens) {
      bytes_ -= it->bytes;
      entries_.erase(it);
      break;
    }
  bytes_ += e.bytes;
  entries_.push_front(std::move(e));
  while (bytes_ > max_bytes_ && entries_.size() > 1) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
}

PromptCacheStats PromptCache::stats() const {
  return {static_cast<int64_t>(entries_.size()), bytes_, max_bytes_, hits_, misses_};
}

}  // namespace hearth::cache
