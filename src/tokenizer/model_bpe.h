// The BPE model of HF tokenizers (models/bpe): vocab, rank-ordered merges, byte fallback, unk
// fusing, ignore_merges, and a bounded per-word cache. Not the pre-tokenizer: it sees one word.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json_fields.h"

namespace hearth::tokenizer {

/// Hash for unordered maps keyed by std::string that accept std::string_view lookups.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  /// Reads `model` (type "BPE": vocab, merges as "a b" strings or [a, b] pairs, unk_token,
  /// byte_fallback, fuse_unk, continuing_subword_prefix, end_of_word_suffix, ignore_merges).
  /// Throws hearth::Error naming `at`'s field for a missing vocab, a merge whose parts or result
  /// are not in the vocab, a malformed merge, or a dropout other than null/0.
  static std::unique_ptr<BpeModel> from_json(const nlohmann::json& model, const jf::At& at);

  /// Appends the ids of `word` (one pre-token, UTF-8) to `out`; HF BPE::tokenize. Thread-safe.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// The token text of `id`, or nullptr when the vocab has no such id.
  const std::string* id_to_token(int32_t id) const;
  /// Number of vocab entries (HF get_vocab_size).
  size_t vocab_len() const { return vocab_.size(); }
  /// Largest id in the vocab, or -1 when empty.
  int32_t max_id() const { return max_id_; }

 private:
  struct MergeInfo {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  std::vector<int32_t> merge_word(std::string_view word) const;

  Vocab vocab_;
  std::unordered_map<int32_t, std::string> vocab_r_;
  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::optional<std::string> unk_token_;
  std::optional<std::string> continuing_subword_prefix_;
  std::optional<std::string> end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int32_t max_id_ = -1;
  std::array<int32_t, 256> byte_ids_{};  // id of "<0xNN>", or -1

  // Word cache (HF: 10,000 words of fewer than 256 bytes), shared across threads.
  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace hearth::tokenizer
