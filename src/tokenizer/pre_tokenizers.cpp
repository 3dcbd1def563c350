// Pre-tokenizers ported from HF tokenizers (pre_tokenizers/*.rs, tokenizer/normalizer.rs split).
// Text only: no offsets are tracked. Not the BPE model, not added-token extraction.
#include "tokenizer/pre_tokenizers.h"

#include <algorithm>

#include "tokenizer/normalizers.h"
#include "tokenizer/unicode.h"

namespace hearth::tokenizer {

SplitBehavior parse_behavior(const nlohmann::json& v, const jf::At& at) {
  std::string s = jf::str(v, at);
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  at.fail(cat("unknown split behavior '", s, "'"));
}

void split_piece(const Piece& piece, const std::vector<Span>& m, SplitBehavior behavior,
                 std::vector<Piece>& out) {
  // (start, end, removed) after applying the behavior, as HF NormalizedString::split folds them.
  struct Cut {
    size_t start, end;
    bool remove;
  };
  std::vector<Cut> cuts;
  cuts.reserve(m.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& s : m) cuts.push_back({s.start, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      for (const auto& s : m) cuts.push_back({s.start, s.end, s.is_match});
      break;
    case SplitBehavior::kContiguous: {
      bool prev = false;
      for (const auto& s : m) {
        if (s.is_match == prev && !cuts.empty()) cuts.back().end = s.end;
        else cuts.push_back({s.start, s.end, false});
        prev = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool prev = false;
      for (const auto& s : m) {
        if (s.is_match && !prev && !cuts.empty()) cuts.back().end = s.end;
        else cuts.push_back({s.start, s.end, false});
        prev = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev = false;
      for (auto it = m.rbegin(); it != m.rend(); ++it) {
        if (it->is_match && !prev && !cuts.empty()) cuts.back().start = it->start;
        else cuts.push_back({it->start, it->end, false});
        prev = it->is_match;
      }
      std::reverse(cuts.begin(), cuts.end());
      break;
    }
  }
  for (const auto& c : cuts) {
    if (c.remove || c.end <= c.start) continue;
    out.push_back({piece.text.substr(c.start, c.end - c.start), -1, piece.at_start && c.start == 0});
  }
}

namespace {

// Applies `fn(piece, out)` to every piece that is not an added token.
template <typename Fn>
void for_each_text(std::vector<Piece>& pieces, Fn fn) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  for (auto& p : pieces) {
    if (p.added_id >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    fn(p, out);
  }
  pieces = std::move(out);
}

class SplitPre : public PreTokenizer {
 public:
  SplitPre(Regex re, SplitBehavior b, bool invert) : re_(std::move(re)), behavior_(b), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for_each_text(pieces, [&](Piece& p, std::vector<Piece>& out) {
      split_piece(p, find_matches(re_, p.text, invert_), behavior_, out);
    });
  }

 private:
  Regex re_;
  SplitBehavior behavior_;
  bool invert_;
};

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex), re_(Regex::compile(kGpt2Pattern, "ByteLevel")) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for_each_text(pieces, [&](Piece& p, std::vector<Piece>& out) {
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text = " " + p.text;
      if (use_regex_) split_piece(p, find_matches(re_, p.text), SplitBehavior::kIsolated, out);
      else if (!p.text.empty()) out.push_back(std::move(p));
    });
    const auto& map = unicode::byte_to_unicode();
    for (auto& p : pieces) {
      if (p.added_id >= 0) continue;
      std::string s;
      s.reserve(p.text.size() * 2);
      for (unsigned char b : p.text) s += map[b];
      p.text = std::move(s);
    }
  }

 private:
  bool add_prefix_space_, use_regex_;
  Regex re_;
};

enum class PrependScheme { kFirst, kNever, kAlways };

class MetaspacePre : public PreTokenizer {
 public:
  MetaspacePre(std::string rep, PrependScheme scheme, bool split)
      : rep_(std::move(rep)), rep_cp_(unicode::decode_at(rep_, 0).cp), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for_each_text(pieces, [&](Piece& p, std::vector<Piece>& out) {
      std::string s;
      for (char c : p.text) {
        if (c == ' ') s += rep_;
        else s += c;
      }
      bool starts = s.compare(0, rep_.size(), rep_) == 0;
      if ((scheme_ == PrependScheme::kAlways && !starts) ||
          (scheme_ == PrependScheme::kFirst && !starts && p.at_start))
        s = rep_ + s;
      p.text = std::move(s);
      if (split_) {
        auto spans = find_char_matches(p.text, [&](char32_t c) { return c == rep_cp_; });
        split_piece(p, spans, SplitBehavior::kMergedWithNext, out);
      } else if (!p.text.empty()) {
        out.push_back(std::move(p));
      }
    });
  }

 private:
  std::string rep_;
  char32_t rep_cp_;
  PrependScheme scheme_;
  bool split_;
};

template <typename Pred>
class CharSplitPre : public PreTokenizer {
 public:
  CharSplitPre(Pred pred, SplitBehavior b) : pred_(pred), behavior_(b) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for_each_text(pieces, [&](Piece& p, std::vector<Piece>& out) {
      split_piece(p, find_char_matches(p.text, pred_), behavior_, out);
    });
  }

 private:
  Pred pred_;
  SplitBehavior behavior_;
};
template <typename Pred>
std::unique_ptr<PreTokenizer> char_split(Pred pred, SplitBehavior b) {
  return std::make_unique<CharSplitPre<Pred>>(pred, b);
}

class SequencePre : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const jf::At& at) {
  std::string type = jf::str(jf::need(j, "type", at), at / "type");
  if (type == "Split") {
    return std::make_unique<SplitPre>(make_pattern(jf::need(j, "pattern", at), at / "pattern"),
                                      parse_behavior(jf::need(j, "behavior", at), at / "behavior"),
                                      jf::opt_bool(j, "invert", false, at));
  }
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPre>(jf::opt_bool(j, "add_prefix_space", true, at),
                                          jf::opt_bool(j, "use_regex", true, at));
  if (type == "Metaspace") {
    std::string rep = jf::str(jf::need(j, "replacement", at), at / "replacement");
    if (rep.empty() || static_cast<size_t>(unicode::decode_at(rep, 0).len) != rep.size() || !unicode::is_valid_utf8(rep))
      (at / "replacement").fail("expected exactly one character");
    std::string scheme = jf::opt_str(j, "prepend_scheme", "always", at);
    PrependScheme ps;
    if (scheme == "always") ps = PrependScheme::kAlways;
    else if (scheme == "first") ps = PrependScheme::kFirst;
    else if (scheme == "never") ps = PrependScheme::kNever;
    else (at / "prepend_scheme").fail(cat("unknown prepend_scheme '", scheme, "'"));
    if (auto it = j.find("add_prefix_space"); it != j.end() && it->is_boolean() && !it->get<bool>()) {
      if (j.contains("prepend_scheme") && ps != PrependScheme::kNever)
        (at / "add_prefix_space").fail("add_prefix_space does not match declared prepend_scheme");
      ps = PrependScheme::kNever;
    }
    return std::make_unique<MetaspacePre>(rep, ps, jf::opt_bool(j, "split", true, at));
  }
  if (type == "Digits") {
    bool individual = jf::opt_bool(j, "individual_digits", false, at);
    return char_split([](char32_t c) { return unicode::is_numeric(c); },
                      individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
  }
  if (type == "Whitespace") {
    // HF: Invert(\w+|[^\w\s]+) with Removed; spans of whitespace are dropped.
    Regex re = Regex::compile(R"([\p{Alpha}\p{M}\p{Nd}\p{Pc}\p{Join_C}]+|[^\p{Alpha}\p{M}\p{Nd}\p{Pc}\p{Join_C}\s]+)",
                              (at / "type").origin + ": Whitespace");
    return std::make_unique<SplitPre>(std::move(re), SplitBehavior::kRemoved, true);
  }
  if (type == "WhitespaceSplit")
    return char_split([](char32_t c) { return unicode::is_whitespace(c); }, SplitBehavior::kRemoved);
  if (type == "Punctuation") {
    SplitBehavior b = j.contains("behavior") ? parse_behavior(j["behavior"], at / "behavior") : SplitBehavior::kIsolated;
    return char_split([](char32_t c) { return unicode::is_punctuation(c); }, b);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    parts.push_back(char_split([](char32_t c) { return unicode::is_whitespace(c); }, SplitBehavior::kRemoved));
    parts.push_back(char_split([](char32_t c) { return unicode::is_punctuation(c); }, SplitBehavior::kIsolated));
    return std::make_unique<SequencePre>(std::move(parts));
  }
  if (type == "CharDelimiterSplit") {
    std::string d = jf::str(jf::need(j, "delimiter", at), at / "delimiter");
    if (d.empty() || !unicode::is_valid_utf8(d) || static_cast<size_t>(unicode::decode_at(d, 0).len) != d.size())
      (at / "delimiter").fail("expected exactly one character");
    char32_t cp = unicode::decode_at(d, 0).cp;
    return char_split([cp](char32_t c) { return c == cp; }, SplitBehavior::kRemoved);
  }
  if (type == "Sequence") {
    const auto& arr = jf::need(j, "pretokenizers", at);
    if (!arr.is_array()) (at / "pretokenizers").fail("expected an array");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < arr.size(); ++i) parts.push_back(make_pre_tokenizer(arr[i], (at / "pretokenizers")[i]));
    return std::make_unique<SequencePre>(std::move(parts));
  }
  (at / "type").fail(cat("unsupported pre_tokenizer type '", type, "'"));
}

}  // namespace hearth::tokenizer
