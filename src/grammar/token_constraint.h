// Grammar-constrained decoding over a tokenizer's vocabulary: the vocabulary as a byte trie (built
// once per tokenizer), the token mask of each automaton state computed by walking that trie with
// the automaton and memoized (shared by requests with the same grammar), and the per-request
// generate::TokenConstraint. Not the grammar itself (grammar.h) nor schema parsing (json_schema.h).
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "generate/constraint.h"
#include "grammar/grammar.h"

namespace hearth::tokenizer {
class Tokenizer;
}

namespace hearth::grammar {

/// A vocabulary as byte strings, with the usable ones in a prefix trie laid out in preorder (each
/// node knows the end of its subtree, so a walk skips a refused prefix in one jump).
class Vocabulary {
 public:
  struct TrieNode {
    uint8_t byte;
    int32_t depth;      ///< 1 for a child of the root
    int32_t end;        ///< index one past this node's subtree
    int32_t tok_begin;  ///< [tok_begin, tok_end) of trie_tokens(): ids whose bytes end here
    int32_t tok_end;
  };
  /// token_bytes[id]: the bytes id adds to a text; usable[id] false (or empty bytes): never
  /// allowed; eos_ids: the ids that end a generation (allowed once the grammar is satisfied).
  Vocabulary(std::vector<std::string> token_bytes, const std::vector<bool>& usable, std::vector<int64_t> eos_ids);
  /// From a tokenizer: each id's bytes as a continuation (Tokenizer::continuation_bytes after one
  /// plain token, so SentencePiece "▁x" is " x"); special and empty tokens are unusable. Costs a
  /// decode per id (about 0.2 s for 128K ids): build once per tokenizer.
  static std::shared_ptr<const Vocabulary> from_tokenizer(const tokenizer::Tokenizer& tok, std::vector<int64_t> eos_ids);

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::string& bytes(int64_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool usable(int64_t id) const { return usable_[static_cast<size_t>(id)]; }
  bool is_eos(int64_t id) const;
  const std::vector<int64_t>& eos_ids() const { return eos_; }
  const std::vector<TrieNode>& trie() const { return trie_; }
  const std::vector<int32_t>& trie_tokens() const { return trie_tokens_; }
  int32_t max_depth() const { return max_depth_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> usable_;
  std::vector<int64_t> eos_;
  std::vector<TrieNode> trie_;
  std::vector<int32_t> trie_tokens_;
  int32_t max_depth_ = 0;
};

/// A grammar's automaton over a vocabulary, with one memoized mask per automaton state. Shared by
/// every request with the same grammar (a mutex guards it); the per-request state lives in
/// GrammarConstraint.
class TokenAutomaton {
 public:
  struct Mask {
    at::Tensor forbidden;     ///< bool [vocabulary size] on the CPU: true = the token may not come next
    int64_t allowed = 0;      ///< tokens allowed (EOS included)
  };
  TokenAutomaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab);

  /// The mask of `state`: the usable tokens whose bytes keep the automaton alive, plus the EOS ids
  /// when the state accepts (or when nothing else is allowed: a dead end ends the text rather
  /// than sampling outside the mask). Memoized (the first call walks the trie).
  std::shared_ptr<const Mask> mask(int32_t state);
  /// The state after the bytes of `token` (Automaton::kDead when refused).
  int32_t advance(int32_t state, int64_t token);
  bool accepting(int32_t state);
  bool final(int32_t state);
  size_t num_states();
  const Vocabulary& vocab() const { return *vocab_; }

 private:
  std::shared_ptr<const Mask> walk(int32_t state);
  std::mutex mu_;
  Automaton automaton_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::unordered_map<int32_t, std::shared_ptr<const Mask>> masks_;
  std::vector<uint8_t> scratch_;
  std::vector<int32_t> stack_;
};

/// The per-request constraint (src/generate/constraint.h): the current automaton state, advanced
/// by each accepted token. One per sequence; not thread-safe.
class GrammarConstraint : public generate::TokenConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<TokenAutomaton> automaton);
  /// Sets the logits of forbidden tokens to -inf in place: logits [V] float32, any device. Ids at
  /// or past the vocabulary size (padding rows of the embedding) are forbidden; a V smaller than
  /// the vocabulary masks its first V ids.
  void mask(at::Tensor& logits) override;
  /// Advances with `token`; an EOS id ends the text. Throws hearth::Error for a token the mask
  /// forbade.
  void accept(int64_t token) override;
  bool complete() const override;
  int32_t state() const { return state_; }

 private:
  std::shared_ptr<TokenAutomaton> automaton_;
  int32_t state_;
  bool ended_ = false;
  bool final_ = false;
};

}  // namespace hearth::grammar
