// Added-token registry and extraction, ported from HF tokenizers' tokenizer/added_vocabulary.rs.
// Not the pre-tokenizer: pieces it returns are split further by the pre-tokenizer.
#include "tokenizer/added_vocab.h"

#include "tokenizer/unicode.h"

namespace hearth::tokenizer {

void AddedVocab::Trie::insert(std::string_view s, int32_t id) {
  int32_t node = 0;
  for (unsigned char b : s) {
    uint64_t key = (static_cast<uint64_t>(node) << 8) | b;
    auto it = edges.find(key);
    if (it == edges.end()) {
      int32_t n = static_cast<int32_t>(value.size());
      value.push_back(-1);
      it = edges.emplace(key, n).first;
    }
    node = it->second;
  }
  // daachorse keeps the first value for duplicate patterns; HF never builds duplicates by content.
  if (value[node] < 0) value[node] = id;
}

void AddedVocab::add(const std::vector<AddedToken>& tokens, const BpeModel& model, const Normalizer* normalizer) {
  int32_t next_id = static_cast<int32_t>(model.vocab_len());
  if (max_id_ >= 0 && (max_id_ >= next_id || model.vocab_len() == 0)) next_id = max_id_ + 1;
  for (const auto& t : tokens) {
    if (t.content.empty()) continue;
    int32_t id;
    if (auto a = token_to_id(t.content)) id = *a;
    else if (auto m = model.token_to_id(t.content)) id = *m;
    else id = next_id++;
    if (t.normalized && normalizer) {
      std::string s = t.content;
      normalizer->normalize(s);
      if (s != t.content) normalized_form_[id] = s;
    }
    by_content_[t.content] = id;
    if (t.special) special_.insert(t.content);
    by_id_[id] = t;
    max_id_ = std::max(max_id_, id);
  }
  raw_trie_ = Trie{};
  normalized_trie_ = Trie{};
  for (const auto& [id, t] : by_id_) {
    if (t.normalized) {
      auto it = normalized_form_.find(id);
      normalized_trie_.insert(it != normalized_form_.end() ? it->second : t.content, id);
    } else {
      raw_trie_.insert(t.content, id);
    }
  }
}

std::optional<int32_t> AddedVocab::token_to_id(std::string_view content) const {
  auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const std::string* AddedVocab::id_to_token(int32_t id) const {
  if (auto n = normalized_form_.find(id); n != normalized_form_.end()) return &n->second;
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second.content;
}

bool AddedVocab::is_special_token(std::string_view token) const { return special_.find(token) != special_.end(); }

namespace {
// Last code point of s[0, end) (end > 0).
char32_t last_cp(std::string_view s, size_t end) {
  size_t k = end - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return unicode::decode_at(s, k).cp;
}
size_t prev_boundary(std::string_view s, size_t end) {
  size_t k = end - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return k;
}
}  // namespace

std::vector<AddedVocab::Match> AddedVocab::find_matches(std::string_view s, const Trie& trie) const {
  std::vector<Match> out;
  if (trie.empty()) return out;
  // Leftmost-longest, non-overlapping (daachorse MatchKind::LeftmostLongest).
  std::vector<Match> raw;
  for (size_t i = 0; i < s.size();) {
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t k = i; k < s.size(); ++k) {
      auto it = trie.edges.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(s[k]));
      if (it == trie.edges.end()) break;
      node = it->second;
      if (trie.value[node] >= 0) {
        best = trie.value[node];
        best_end = k + 1;
      }
    }
    if (best >= 0) {
      raw.push_back({i, best_end, best});
      i = best_end;
    } else {
      ++i;
    }
  }
  size_t start_offset = 0;
  for (Match m : raw) {
    const AddedToken& t = by_id_.at(m.id);
    if (t.single_word) {
      bool start_space = m.start == 0 || !unicode::is_word_char(last_cp(s, m.start));
      bool stop_space = m.end == s.size() || !unicode::is_word_char(unicode::decode_at(s, m.end).cp);
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t ns = m.start;
      while (ns > 0 && unicode::is_whitespace(last_cp(s, ns))) ns = prev_boundary(s, ns);
      m.start = std::max(ns, start_offset);
    }
    if (t.rstrip) {
      while (m.end < s.size()) {
        auto p = unicode::decode_at(s, m.end);
        if (!unicode::is_whitespace(p.cp)) break;
        m.end += p.len;
      }
    }
    out.push_back(m);
    start_offset = m.end;
  }
  return out;
}

void AddedVocab::split_on(const Piece& piece, const Trie& trie, std::vector<Piece>& out) const {
  const std::string& s = piece.text;
  size_t start_offset = 0;
  auto emit = [&](size_t a, size_t b, int32_t id) {
    if (b <= a) return;  // HF drops empty splits
    out.push_back({s.substr(a, b - a), id, piece.at_start && a == 0});
  };
  for (const Match& m : find_matches(s, trie)) {
    emit(start_offset, m.start, -1);
    emit(m.start, m.end, m.id);
    start_offset = m.end;
  }
  emit(start_offset, s.size(), -1);
}

std::vector<Piece> AddedVocab::extract_and_normalize(std::string_view text, const Normalizer* normalizer) const {
  std::vector<Piece> first;
  split_on(Piece{std::string(text), -1, true}, raw_trie_, first);
  std::vector<Piece> out;
  out.reserve(first.size());
  for (auto& p : first) {
    if (p.added_id >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    if (normalizer) normalizer->normalize(p.text);
    split_on(p, normalized_trie_, out);
  }
  return out;
}

}  // namespace hearth::tokenizer
