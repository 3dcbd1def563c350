// Added tokens (tokenizer.json "added_tokens"): ids, special flags, and their extraction from the
// input before the model runs, as HF tokenizers' AddedVocabulary does (leftmost-longest matching;
// non-normalized tokens on the raw text, normalized ones on the normalized pieces).
// Not the BPE vocab: tokens are only looked up there to reuse existing ids.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tokenizer/model_bpe.h"
#include "tokenizer/normalizers.h"
#include "tokenizer/pre_tokenizers.h"

namespace hearth::tokenizer {

struct AddedToken {
  std::string content;
  bool single_word = false;  // match only when not inside a word (Rust regex \w on both sides)
  bool lstrip = false;       // swallow the whitespace on the left
  bool rstrip = false;       // swallow the whitespace on the right
  bool normalized = true;    // match against the normalized text instead of the raw text
  bool special = false;      // dropped by decode(skip_special_tokens=true)
};

class AddedVocab {
 public:
  /// Registers `tokens` in order (HF AddedVocabulary::add_tokens): a token keeps the id it already
  /// has (added earlier or in the model vocab), otherwise takes the next id after the model's
  /// vocab size. Empty contents are ignored. `normalizer` (may be null) computes the normalized
  /// form of normalized tokens.
  void add(const std::vector<AddedToken>& tokens, const BpeModel& model, const Normalizer* normalizer);

  /// HF extract_and_normalize: cuts `text` at added tokens (raw text first, then normalized
  /// pieces), normalizing the pieces between them. Pieces with added_id >= 0 are added tokens.
  std::vector<Piece> extract_and_normalize(std::string_view text, const Normalizer* normalizer) const;

  std::optional<int32_t> token_to_id(std::string_view content) const;
  /// The decode-side text of added token `id` (its normalized form when it has one), or nullptr.
  const std::string* id_to_token(int32_t id) const;
  /// True when `token` is the content of a special added token (HF compares by content).
  bool is_special_token(std::string_view token) const;
  /// Largest added id, or -1.
  int32_t max_id() const { return max_id_; }
  const std::unordered_map<int32_t, AddedToken>& tokens() const { return by_id_; }

 private:
  // Byte trie for leftmost-longest matching; edges keyed by (node << 8 | byte).
  struct Trie {
    std::unordered_map<uint64_t, int32_t> edges;
    std::vector<int32_t> value{-1};  // added id at each node, or -1
    void insert(std::string_view s, int32_t id);
    bool empty() const { return value.size() == 1; }
  };
  struct Match {
    size_t start, end;
    int32_t id;
  };
  std::vector<Match> find_matches(std::string_view s, const Trie& trie) const;
  void split_on(const Piece& piece, const Trie& trie, std::vector<Piece>& out) const;

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> by_content_;
  std::unordered_map<int32_t, AddedToken> by_id_;
  std::unordered_map<int32_t, std::string> normalized_form_;
  std::unordered_set<std::string, StringHash, std::equal_to<>> special_;
  Trie raw_trie_, normalized_trie_;
  int32_t max_id_ = -1;
};

}  // namespace hearth::tokenizer
