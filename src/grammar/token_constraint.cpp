// The vocabulary trie (sorted byte strings → preorder nodes with subtree ends), the mask walk
// (one automaton step per trie node, skipping refused subtrees) and the per-request constraint.
// Not the grammar construction (json_schema.cpp) nor the server wiring (server/structured_output).
#include "grammar/token_constraint.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace hearth::grammar {

namespace {
constexpr size_t kMaxMasks = 256;  // memoized masks per automaton before the memo is cleared
}

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, const std::vector<bool>& usable, std::vector<int64_t> eos_ids)
    : bytes_(std::move(token_bytes)), usable_(bytes_.size(), false), eos_(std::move(eos_ids)) {
  std::sort(eos_.begin(), eos_.end());
  eos_.erase(std::unique(eos_.begin(), eos_.end()), eos_.end());
  std::vector<int32_t> ids;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    usable_[i] = i < usable.size() && usable[i] && !bytes_[i].empty() && !is_eos(static_cast<int64_t>(i));
    if (usable_[i]) ids.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  // Preorder: for each string in sorted order, pop the path to the common prefix, push the rest.
  std::vector<int32_t> path;  // trie node index per depth - 1
  const std::string* prev = nullptr;
  for (int32_t id : ids) {
    const std::string& s = bytes_[static_cast<size_t>(id)];
    size_t common = 0;
    if (prev)
      while (common < prev->size() && common < s.size() && (*prev)[common] == s[common]) ++common;
    common = std::min(common, path.size());
    while (path.size() > common) {
      trie_[static_cast<size_t>(path.back())].end = static_cast<int32_t>(trie_.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      const int32_t tok = static_cast<int32_t>(trie_tokens_.size());
      trie_.push_back(TrieNode{static_cast<uint8_t>(s[d]), static_cast<int32_t>(d + 1), -1, tok, tok});
      path.push_back(static_cast<int32_t>(trie_.size() - 1));
    }
    TrieNode& last = trie_[static_cast<size_t>(path.back())];
    if (last.tok_end != static_cast<int32_t>(trie_tokens_.size())) last.tok_begin = last.tok_end = static_cast<int32_t>(trie_tokens_.size());
    trie_tokens_.push_back(id);
    ++last.tok_end;
    max_depth_ = std::max(max_depth_, static_cast<int32_t>(s.size()));
    prev = &s;
  }
  while (!path.empty()) {
    trie_[static_cast<size_t>(path.back())].end = static_cast<int32_t>(trie_.size());
    path.pop_back();
  }
}

bool Vocabulary::is_eos(int64_t id) const { return std::binary_search(eos_.begin(), eos_.end(), id); }

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const tokenizer::Tokenizer& tok, std::vector<int64_t> eos_ids) {
  const int32_t n = tok.vocab_size();
  // A plain one-character token as the context, so a SentencePiece decoder does not drop the
  // leading space of the token as it does at the start of a text.
  std::vector<int32_t> context;
  for (const char* c : {"a", "x", "e"})
    if (auto id = tok.token_to_id(c); id && !tok.is_special(*id)) {
      context.push_back(*id);
      break;
    }
  std::vector<std::string> bytes(static_cast<size_t>(n));
  std::vector<bool> usable(static_cast<size_t>(n), false);
  for (int32_t id = 0; id < n; ++id) {
    if (tok.is_special(id) || tok.id_to_token(id).empty()) continue;
    bytes[static_cast<size_t>(id)] = context.empty() ? tok.decode_bytes({id}, false) : tok.continuation_bytes(context, id);
    usable[static_cast<size_t>(id)] = true;
  }
  return std::make_shared<const Vocabulary>(std::move(bytes), usable, std::move(eos_ids));
}

TokenAutomaton::TokenAutomaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab)
    : automaton_(std::move(grammar)), vocab_(std::move(vocab)) {
  HEARTH_CHECK(vocab_, "TokenAutomaton: no vocabulary");
}

std::shared_ptr<const TokenAutomaton::Mask> TokenAutomaton::mask(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = masks_.find(state);
  if (it != masks_.end()) return it->second;
  if (masks_.size() >= kMaxMasks) masks_.clear();
  auto m = walk(state);
  masks_.emplace(state, m);
  return m;
}

std::shared_ptr<const TokenAutomaton::Mask> TokenAutomaton::walk(int32_t state) {
  const int64_t V = vocab_->size();
  auto m = std::make_shared<Mask>();
  m->forbidden = at::ones({V}, at::kBool);
  bool* forbidden = m->forbidden.data_ptr<bool>();
  int64_t allowed = 0;
  if (!automaton_.final(state)) {
    const auto& trie = vocab_->trie();
    const auto& toks = vocab_->trie_tokens();
    stack_.assign(static_cast<size_t>(vocab_->max_depth()) + 1, Automaton::kDead);
    stack_[0] = state;
    const size_t n = trie.size();
    for (size_t i = 0; i < n;) {
      const Vocabulary::TrieNode& node = trie[i];
      const int32_t s = automaton_.step(stack_[static_cast<size_t>(node.depth - 1)], node.byte);
      if (s < 0) {
        i = static_cast<size_t>(node.end);
        continue;
      }
      stack_[static_cast<size_t>(node.depth)] = s;
      for (int32_t k = node.tok_begin; k < node.tok_end; ++k) forbidden[toks[static_cast<size_t>(k)]] = false;
      allowed += node.tok_end - node.tok_begin;
      ++i;
    }
  }
  if (automaton_.accepting(state) || allowed == 0) {
    for (int64_t id : vocab_->eos_ids())
      if (id >= 0 && id < V) {
        forbidden[id] = false;
        ++allowed;
      }
  }
  m->allowed = allowed;
  return m;
}

int32_t TokenAutomaton::advance(int32_t state, int64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  if (token < 0 || token >= vocab_->size() || !vocab_->usable(token)) return Automaton::kDead;
  return automaton_.walk(state, vocab_->bytes(token));
}

bool TokenAutomaton::accepting(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return automaton_.accepting(state);
}

bool TokenAutomaton::final(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return automaton_.final(state);
}

size_t TokenAutomaton::num_states() {
  std::lock_guard<std::mutex> lock(mu_);
  return automaton_.num_states();
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<TokenAutomaton> automaton)
    : automaton_(std::move(automaton)), state_(0) {
  HEARTH_CHECK(automaton_, "GrammarConstraint: no automaton");
  final_ = automaton_->final(state_);
}

void GrammarConstraint::mask(at::Tensor& logits) {
  HEARTH_CHECK(logits.dim() == 1, "GrammarConstraint::mask: logits must be [V], got ", logits.sizes());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (ended_) {
    logits.fill_(kNegInf);
    return;
  }
  auto m = automaton_->mask(state_);
  const int64_t V = logits.size(0);
  const int64_t W = automaton_->vocab().size();
  const int64_t n = std::min(V, W);
  at::Tensor f = m->forbidden.narrow(0, 0, n).to(logits.device());
  logits.narrow(0, 0, n).masked_fill_(f, kNegInf);
  if (V > W) logits.narrow(0, W, V - W).fill_(kNegInf);
}

void GrammarConstraint::accept(int64_t token) {
  HEARTH_CHECK(!ended_, "structured output: token ", token, " after the end of the text");
  if (automaton_->vocab().is_eos(token)) {
    // Allowed when the text is complete, or as the way out of a dead end (mask() allows it then).
    HEARTH_CHECK(automaton_->accepting(state_) || automaton_->mask(state_)->allowed <= static_cast<int64_t>(automaton_->vocab().eos_ids().size()),
                 "structured output: end of sequence before the JSON is complete");
    ended_ = true;
    return;
  }
  const int32_t next = automaton_->advance(state_, token);
  HEARTH_CHECK(next >= 0, "structured output: token ", token, " is not allowed by the grammar here");
  state_ = next;
  final_ = automaton_->final(state_);
}

bool GrammarConstraint::complete() const { return final_ || ended_; }

}  // namespace hearth::grammar
