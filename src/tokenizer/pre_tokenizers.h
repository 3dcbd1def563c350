// tokenizer.json "pre_tokenizer" components (HF tokenizers pre_tokenizers/): Split, ByteLevel,
// Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, CharDelimiterSplit,
// Sequence. They cut normalized text into pieces (words) for the model. Not the normalizers.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"

namespace hearth::tokenizer {

/// One piece of the text being encoded: an added token already resolved (`added_id` >= 0), or
/// text still to be split and run through the model. `at_start`: the piece begins at offset 0 of
/// the original input (what Metaspace's prepend_scheme "first" asks).
struct Piece {
  std::string text;
  int32_t added_id = -1;
  bool at_start = false;
};

/// HF SplitDelimiterBehavior.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

/// Parses "Removed" / "Isolated" / ... ; throws hearth::Error naming `at` otherwise.
SplitBehavior parse_behavior(const nlohmann::json& v, const jf::At& at);

/// Cuts `piece` along `spans` (which cover its text, see find_matches) as `behavior` says, and
/// appends the non-empty results to `out` (HF NormalizedString::split + PreTokenizedString::split).
void split_piece(const Piece& piece, const std::vector<Span>& spans, SplitBehavior behavior,
                 std::vector<Piece>& out);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// Splits every piece that is not an added token; added-token pieces pass through unchanged.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

/// Builds the pre-tokenizer described by `j`. Throws hearth::Error naming `at` for an unknown
/// type, a missing field or a bad regex.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const jf::At& at);

}  // namespace hearth::tokenizer
