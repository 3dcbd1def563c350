// A compiled regular expression with the matching semantics HF tokenizers gets from Oniguruma:
// PCRE2 (UTF + UCP) underneath, Oniguruma's `\s` set, and onig's find_iter rule for empty matches.
// Not a general regex API: it only finds non-overlapping matches left to right.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/unicode.h"

namespace hearth::tokenizer {

/// A byte range [start, end) of a text and whether it is a match (true) or the text between
/// matches (false); see find_matches.
struct Span {
  size_t start;
  size_t end;
  bool is_match;
};

class Regex {
 public:
  /// Compiles `pattern`, written in the Oniguruma dialect tokenizer.json uses (`\p{L}`, `(?i:..)`,
  /// lookahead). Throws hearth::Error("<where>: <PCRE2's message> at offset N") when it does not
  /// compile.
  static Regex compile(std::string_view pattern, const std::string& where);
  /// A pattern that matches `text` literally (HF compiles regex::escape(text)).
  static Regex literal(std::string_view text, const std::string& where);

  /// All non-overlapping matches [start, end) left to right, as onig's find_iter yields them: an
  /// empty match is skipped when it ends where the previous match ended. `text` must be valid UTF-8.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
};

/// Spans covering all of `text`: matches and the gaps between them (HF Pattern::find_matches for a
/// regex). An empty `text` gives one non-match span (0, 0). With `invert`, the flags are flipped.
std::vector<Span> find_matches(const Regex& re, std::string_view text, bool invert = false);

/// HF Pattern::find_matches for a per-character predicate: each character for which `pred` holds
/// is its own match span.
template <typename Pred>
std::vector<Span> find_char_matches(std::string_view text, Pred pred);


template <typename Pred>
std::vector<Span> find_char_matches(std::string_view text, Pred pred) {
  if (text.empty()) return {{0, 0, false}};
  std::vector<Span> out;
  size_t last = 0, i = 0;
  while (i < text.size()) {
    unicode::CodePoint p = unicode::decode_at(text, i);
    if (pred(p.cp)) {
      if (last < i) out.push_back({last, i, false});
      out.push_back({i, i + p.len, true});
      last = i + p.len;
    }
    i += p.len;
  }
  if (last < text.size()) out.push_back({last, text.size(), false});
  return out;
}
}  // namespace hearth::tokenizer
