// A byte-level grammar (a recursive transition network: byte-set, split, call and return nodes,
// built back to front by the schema compiler) and its lazily determinized automaton, whose states
// are sets of (node, return stack) threads interned to ids, with a memoized byte-class transition
// table (llama.cpp's grammar stacks, determinized on demand as in XGrammar's persistent stacks).
// Not the JSON Schema compiler (json_schema.h) nor the vocabulary mask (token_constraint.h).
#pragma once
#include <array>
#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hearth::grammar {

using ByteSet = std::bitset<256>;

/// A grammar as a graph of nodes; the language of rule `root` from its start node to its return.
/// Built back to front: every builder takes the node that follows (`next`) and returns the first
/// node of what it built. Rules give recursion ($ref, nested JSON) and sharing (whitespace,
/// strings): a call node enters a rule and continues at `next` when the rule returns.
class Grammar {
 public:
  enum class Kind : uint8_t { kBytes, kSplit, kCall, kReturn };
  struct Node {
    Kind kind = Kind::kReturn;
    ByteSet bytes;               ///< kBytes: the bytes that advance to `next`
    int32_t next = -1;           ///< kBytes, kCall: the following node
    int32_t callee = -1;         ///< kCall: the rule entered
    std::vector<int32_t> alts;   ///< kSplit: alternatives (epsilon edges)
  };

  Grammar();
  /// A node that accepts one byte of `set` and then continues at `next`.
  int32_t bytes(const ByteSet& set, int32_t next);
  /// One byte in [lo, hi].
  int32_t range(uint8_t lo, uint8_t hi, int32_t next);
  /// The exact bytes of `s`, then `next` (returns `next` for an empty string).
  int32_t literal(std::string_view s, int32_t next);
  /// Any of the alternatives (epsilon edges); may be filled later through node().
  int32_t split(std::vector<int32_t> alts);
  /// Enters `rule`, then continues at `next`.
  int32_t call(int32_t rule, int32_t next);
  /// The shared return node (the end of a rule).
  int32_t ret() const { return 0; }
  /// A new rule (its start is set later, so rules may refer to themselves).
  int32_t new_rule();
  void set_rule_start(int32_t rule, int32_t start);
  void set_root(int32_t rule) { root_ = rule; }
  /// Trims the grammar to what can end (the standard "productive nonterminals" fixed point, as in
  /// Hopcroft & Ullman's useless-symbol removal): a node is productive when some path from it
  /// reaches its rule's return through bytes and calls of productive rules, a rule when its start
  /// is. Removes every split's unproductive alternatives (a branch that could never finish, e.g. an
  /// optional property whose schema requires itself without end), so the automaton never enters a
  /// dead branch; returns the unproductive rules in creation order (empty = every rule derives a
  /// finite text; the root among them = the language is empty). O(nodes) per pass, passes bounded by
  /// the nesting of loops and recursion.
  std::vector<int32_t> prune_unproductive();
  size_t num_rules() const { return rule_starts_.size(); }

  Node& node(int32_t id) { return nodes_[static_cast<size_t>(id)]; }
  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  size_t size() const { return nodes_.size(); }
  int32_t rule_start(int32_t rule) const { return rule_starts_[static_cast<size_t>(rule)]; }
  int32_t root() const { return root_; }

  /// A text that identifies the language (e.g. the schema's JSON), for caching automata across
  /// requests: equal keys must mean equal grammars. "" = do not cache.
  std::string key;

 private:
  std::vector<Node> nodes_;
  std::vector<int32_t> rule_starts_;
  int32_t root_ = -1;
};

/// The lazily built deterministic automaton of a Grammar over bytes. State 0 is the start; -1 is
/// dead. Return stacks deeper than `max_depth` calls are cut (that path dies), which bounds nesting
/// and keeps the state set finite. Not thread-safe: callers lock (TokenAutomaton does).
class Automaton {
 public:
  static constexpr int32_t kDead = -1;
  explicit Automaton(std::shared_ptr<const Grammar> grammar, int max_depth = 64);

  int32_t start() const { return 0; }
  /// The state after `byte` from `state` (kDead when the byte is not allowed); memoized.
  int32_t step(int32_t state, uint8_t byte) {
    const size_t i = static_cast<size_t>(state) * nclasses_ + class_of_[byte];
    int32_t t = table_[i];
    if (t == kUnknown) table_[i] = t = compute(state, byte);  // compute() may grow table_
    return t;
  }
  /// The state after all of `bytes` (kDead if any is refused).
  int32_t walk(int32_t state, std::string_view bytes);
  /// The text so far is a complete sentence of the grammar.
  bool accepting(int32_t state) const;
  /// Accepting, and no byte may follow.
  bool final(int32_t state) const;
  size_t num_states() const { return states_.size(); }
  const Grammar& grammar() const { return *grammar_; }

 private:
  static constexpr int32_t kUnknown = -2;
  static constexpr int32_t kAccept = -1;  // a thread's pc when the root rule has returned
  struct Thread {
    int32_t pc;
    int32_t rs;  // return stack id (0 = empty)
    bool operator<(const Thread& o) const { return pc != o.pc ? pc < o.pc : rs < o.rs; }
    bool operator==(const Thread& o) const { return pc == o.pc && rs == o.rs; }
  };
  struct Frame {
    int32_t ret;
    int32_t parent;
    int32_t depth;
  };
  int32_t compute(int32_t state, uint8_t byte);
  void closure(int32_t pc, int32_t rs, std::vector<Thread>& out);
  int32_t push_frame(int32_t ret, int32_t parent);
  int32_t intern(std::vector<Thread> threads);

  std::shared_ptr<const Grammar> grammar_;
  int max_depth_;
  std::array<uint8_t, 256> class_of_{};
  std::array<uint8_t, 256> class_rep_{};  // one byte of each class
  size_t nclasses_ = 1;
  std::vector<std::vector<Thread>> states_;
  std::unordered_map<std::string, int32_t> state_ids_;
  std::vector<int32_t> table_;  // states × classes
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> frame_ids_;
};

}  // namespace hearth::grammar
