// BPE merging as HF tokenizers does it (models/bpe/model.rs + word.rs): characters (with
// byte-fallback / unk handling) merged by lowest rank then leftmost position through a heap.
// Not the added-token matcher or pre-tokenizer; those run before a word gets here.
#include "tokenizer/model_bpe.h"

#include <cstdio>
#include <mutex>
#include <queue>

#include "tokenizer/unicode.h"

namespace hearth::tokenizer {

std::unique_ptr<BpeModel> BpeModel::from_json(const nlohmann::json& model, const jf::At& at) {
  auto m = std::make_unique<BpeModel>();
  const auto& vocab = jf::need(model, "vocab", at);
  if (!vocab.is_object()) (at / "vocab").fail("expected an object {token: id}");
  m->vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int32_t id = jf::token_id(it.value(), at / "vocab" / it.key());
    m->vocab_[it.key()] = id;
    m->vocab_r_[id] = it.key();
    m->max_id_ = std::max(m->max_id_, id);
  }
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    if (!it->is_number()) (at / "dropout").fail("expected a number or null");
    double p = it->get<double>();
    if (p < 0.0 || p > 1.0) (at / "dropout").fail("must be in [0, 1]");
    if (p != 0.0) (at / "dropout").fail("BPE dropout is not supported (inference only)");
  }
  auto opt = [&](const char* key) -> std::optional<std::string> {
    auto it = model.find(key);
    if (it == model.end() || it->is_null()) return std::nullopt;
    return jf::str(*it, at / key);
  };
  m->unk_token_ = opt("unk_token");
  m->continuing_subword_prefix_ = opt("continuing_subword_prefix");
  m->end_of_word_suffix_ = opt("end_of_word_suffix");
  m->fuse_unk_ = jf::opt_bool(model, "fuse_unk", false, at);
  m->byte_fallback_ = jf::opt_bool(model, "byte_fallback", false, at);
  m->ignore_merges_ = jf::opt_bool(model, "ignore_merges", false, at);

  m->byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    if (auto id = m->token_to_id(name)) m->byte_ids_[b] = *id;
  }

  const auto& merges = jf::need(model, "merges", at);
  if (!merges.is_array()) (at / "merges").fail("expected an array");
  size_t prefix_len = m->continuing_subword_prefix_ ? m->continuing_subword_prefix_->size() : 0;
  m->merges_.reserve(merges.size());
  uint32_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& e = merges[i];
    jf::At ai = (at / "merges")[i];
    std::string a, b;
    if (e.is_string()) {
      const std::string& line = e.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        ai.fail("expected \"a b\" (two tokens separated by one space)");
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2) {
      a = jf::str(e[0], ai[0]);
      b = jf::str(e[1], ai[1]);
    } else {
      ai.fail("expected \"a b\" or [a, b]");
    }
    auto ia = m->token_to_id(a);
    if (!ia) ai.fail(cat("merge token '", a, "' is not in the vocab"));
    auto ib = m->token_to_id(b);
    if (!ib) ai.fail(cat("merge token '", b, "' is not in the vocab"));
    if (b.size() < prefix_len) ai.fail("merge token shorter than continuing_subword_prefix");
    std::string merged = a + b.substr(prefix_len);
    auto inew = m->token_to_id(merged);
    if (!inew) ai.fail(cat("merged token '", merged, "' is not in the vocab"));
    m->merges_[pair_key(*ia, *ib)] = MergeInfo{rank, *inew};  // a repeated pair keeps the last rank
    ++rank;
  }
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  auto it = vocab_r_.find(id);
  return it == vocab_r_.end() ? nullptr : &it->second;
}

std::vector<int32_t> BpeModel::merge_word(std::string_view w) const {
  struct Symbol {
    int32_t c;
    int64_t prev, next;
    size_t len;
  };
  std::vector<Symbol> sym;
  sym.reserve(w.size());
  auto add = [&](int32_t c, size_t len) {
    int64_t n = static_cast<int64_t>(sym.size());
    if (!sym.empty()) sym.back().next = n;
    sym.push_back({c, n - 1, -1, len});
  };
  bool have_unk = false;  // a pending (possibly fused) unk symbol
  int32_t unk_sym = 0;
  size_t unk_len = 0;
  auto unk_id = [&]() -> int32_t {
    auto id = token_to_id(*unk_token_);
    HEARTH_CHECK(id, "tokenizer.json: model.unk_token: '", *unk_token_, "' is not in the vocab");
    return *id;
  };
  std::string s;
  for (size_t i = 0; i < w.size();) {
    int len = unicode::utf8_len(static_cast<unsigned char>(w[i]));
    if (i + len > w.size()) len = static_cast<int>(w.size() - i);
    bool is_first = i == 0, is_last = i + len >= w.size();
    s.assign(w.substr(i, len));
    if (!is_first && continuing_subword_prefix_) s = *continuing_subword_prefix_ + s;
    if (is_last && end_of_word_suffix_) s += *end_of_word_suffix_;
    i += len;
    if (auto id = token_to_id(s)) {
      if (have_unk) {
        add(unk_sym, unk_len);
        have_unk = false;
      }
      add(*id, static_cast<size_t>(len));
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : s) all = all && byte_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : s) add(byte_ids_[b], 1);
        continue;
      }
    }
    if (unk_token_) {
      if (have_unk && fuse_unk_) {
        unk_len += len;
      } else {
        if (have_unk) add(unk_sym, unk_len);
        unk_sym = unk_id();
        unk_len = static_cast<size_t>(len);
        have_unk = true;
      }
    }
  }
  if (have_unk) add(unk_sym, unk_len);

  struct Merge {
    size_t pos;
    uint32_t rank;
    int32_t new_id;
    bool operator<(const Merge& o) const {  // priority_queue pops the largest: invert
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Merge> queue;
  for (size_t i = 0; i + 1 < sym.size(); ++i) {
    auto it = merges_.find(pair_key(sym[i].c, sym[i + 1].c));
    if (it != merges_.end()) queue.push({i, it->second.rank, it->second.new_id});
  }
  while (!queue.empty()) {
    Merge top = queue.top();
    queue.pop();
    Symbol& cur = sym[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    size_t next_pos = static_cast<size_t>(cur.next);
    Symbol right = sym[next_pos];
    auto it = merges_.find(pair_key(cur.c, right.c));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    cur.c = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    sym[next_pos].len = 0;
    if (right.next > -1 && static_cast<size_t>(right.next) < sym.size()) sym[right.next].prev = static_cast<int64_t>(top.pos);
    if (cur.prev >= 0) {
      auto p = merges_.find(pair_key(sym[cur.prev].c, cur.c));
      if (p != merges_.end()) queue.push({static_cast<size_t>(cur.prev), p->second.rank, p->second.new_id});
    }
    if (cur.next >= 0 && static_cast<size_t>(cur.next) < sym.size()) {
      auto n = merges_.find(pair_key(cur.c, sym[cur.next].c));
      if (n != merges_.end()) queue.push({top.pos, n->second.rank, n->second.new_id});
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(sym.size());
  for (const auto& x : sym)
    if (x.len != 0) ids.push_back(x.c);
  return ids;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  bool cacheable = word.size() < kCacheMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace hearth::tokenizer
