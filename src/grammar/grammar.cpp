// Grammar node building and the lazy determinization of its automaton: a state is the sorted set
// of threads (a byte-set node or "accepted", with an interned return stack) reachable after the
// bytes so far; a transition closes over split/call/return edges. Not vocabulary-aware.
#include "grammar/grammar.h"

#include <algorithm>
#include <map>
#include <unordered_set>

#include "core/error.h"

namespace hearth::grammar {

namespace {
// Hard cap on automaton states (each costs a transition row): a grammar that needs more is a
// request the server cannot afford, reported as an error rather than eating memory.
constexpr size_t kMaxStates = 400000;
}  // namespace

Grammar::Grammar() { nodes_.push_back(Node{});  /* node 0: the shared return */ }

int32_t Grammar::bytes(const ByteSet& set, int32_t next) {
  Node n;
  n.kind = Kind::kBytes;
  n.bytes = set;
  n.next = next;
  nodes_.push_back(std::move(n));
  return static_cast<int32_t>(nodes_.size() - 1);
}

int32_t Grammar::range(uint8_t lo, uint8_t hi, int32_t next) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(static_cast<size_t>(b));
  return bytes(s, next);
}

int32_t Grammar::literal(std::string_view s, int32_t next) {
  for (size_t i = s.size(); i-- > 0;) {
    ByteSet one;
    one.set(static_cast<uint8_t>(s[i]));
    next = bytes(one, next);
  }
  return next;
}

int32_t Grammar::split(std::vector<int32_t> alts) {
  Node n;
  n.kind = Kind::kSplit;
  n.alts = std::move(alts);
  nodes_.push_back(std::move(n));
  return static_cast<int32_t>(nodes_.size() - 1);
}

int32_t Grammar::call(int32_t rule, int32_t next) {
  Node n;
  n.kind = Kind::kCall;
  n.callee = rule;
  n.next = next;
  nodes_.push_back(std::move(n));
  return static_cast<int32_t>(nodes_.size() - 1);
}

int32_t Grammar::new_rule() {
  rule_starts_.push_back(-1);
  return static_cast<int32_t>(rule_starts_.size() - 1);
}

void Grammar::set_rule_start(int32_t rule, int32_t start) { rule_starts_[static_cast<size_t>(rule)] = start; }

std::vector<int32_t> Grammar::prune_unproductive() {
  const size_t n = nodes_.size();
  std::vector<uint8_t> ok(n, 0), rule_ok(rule_starts_.size(), 0);
  auto good = [&](int32_t id) { return id >= 0 && static_cast<size_t>(id) < n && ok[static_cast<size_t>(id)]; };
  for (bool changed = true; changed;) {
    changed = false;
    // Nodes are built back to front (a node's `next` has a smaller id), so one pass in id order
    // settles a chain; loops and recursion take further passes.
    for (size_t i = 0; i < n; ++i) {
      if (ok[i]) continue;
      const Node& nd = nodes_[i];
      bool v = false;
      switch (nd.kind) {
        case Kind::kReturn: v = true; break;
        case Kind::kBytes: v = nd.bytes.any() && good(nd.next); break;
        case Kind::kCall: v = nd.callee >= 0 && rule_ok[static_cast<size_t>(nd.callee)] && good(nd.next); break;
        case Kind::kSplit: v = std::any_of(nd.alts.begin(), nd.alts.end(), good); break;
      }
      if (v) {
        ok[i] = 1;
        changed = true;
      }
    }
    for (size_t r = 0; r < rule_starts_.size(); ++r)
      if (!rule_ok[r] && good(rule_starts_[r])) {
        rule_ok[r] = 1;
        changed = true;
      }
  }
  for (Node& nd : nodes_)
    if (nd.kind == Kind::kSplit) std::erase_if(nd.alts, [&](int32_t a) { return !good(a); });
  std::vector<int32_t> bad;
  for (size_t r = 0; r < rule_starts_.size(); ++r)
    if (!rule_ok[r]) bad.push_back(static_cast<int32_t>(r));
  return bad;
}

Automaton::Automaton(std::shared_ptr<const Grammar> grammar, int max_depth)
    : grammar_(std::move(grammar)), max_depth_(max_depth) {
  HEARTH_CHECK(grammar_ && grammar_->root() >= 0 && grammar_->rule_start(grammar_->root()) >= 0,
               "grammar: no root rule");
  // Byte classes: bytes that every byte-set node treats alike share a transition column.
  std::map<std::vector<bool>, uint8_t> classes;
  // Deduplicate the sets first (many nodes share one set) by hash: sorting every node's set by its
  // 256-character text took seconds for a grammar of a few hundred thousand nodes (a large enum).
  // The partition into classes does not depend on the order of the distinct sets.
  std::unordered_set<ByteSet> distinct;
  for (size_t i = 0; i < grammar_->size(); ++i)
    if (grammar_->node(static_cast<int32_t>(i)).kind == Grammar::Kind::kBytes)
      distinct.insert(grammar_->node(static_cast<int32_t>(i)).bytes);
  std::vector<const ByteSet*> sets;
  for (const ByteSet& set : distinct) sets.push_back(&set);
  for (int b = 0; b < 256; ++b) {
    std::vector<bool> sig(sets.size());
    for (size_t k = 0; k < sets.size(); ++k) sig[k] = sets[k]->test(static_cast<size_t>(b));
    auto [it, fresh] = classes.emplace(std::move(sig), static_cast<uint8_t>(classes.size()));
    class_of_[static_cast<size_t>(b)] = it->second;
    if (fresh) class_rep_[it->second] = static_cast<uint8_t>(b);
  }
  nclasses_ = classes.size();
  frames_.push_back(Frame{-1, -1, 0});  // 0: the empty stack
  std::vector<Thread> init;
  closure(grammar_->rule_start(grammar_->root()), 0, init);
  intern(std::move(init));  // state 0 (possibly empty: a grammar with no sentence is dead at once)
}

int32_t Automaton::push_frame(int32_t ret, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ret)) << 32) | static_cast<uint32_t>(parent);
  auto it = frame_ids_.find(key);
  if (it != frame_ids_.end()) return it->second;
  const int32_t depth = frames_[static_cast<size_t>(parent)].depth + 1;
  if (depth > max_depth_) return -1;
  frames_.push_back(Frame{ret, parent, depth});
  const int32_t id = static_cast<int32_t>(frames_.size() - 1);
  frame_ids_.emplace(key, id);
  return id;
}

void Automaton::closure(int32_t pc0, int32_t rs0, std::vector<Thread>& out) {
  std::vector<Thread> todo{{pc0, rs0}};
  std::unordered_set<uint64_t> seen;
  const Grammar& g = *grammar_;
  while (!todo.empty()) {
    Thread t = todo.back();
    todo.pop_back();
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(t.pc)) << 32) | static_cast<uint32_t>(t.rs);
    if (!seen.insert(key).second) continue;
    if (t.pc == kAccept) {
      out.push_back(t);
      continue;
    }
    const Grammar::Node& n = g.node(t.pc);
    switch (n.kind) {
      case Grammar::Kind::kBytes: out.push_back(t); break;
      case Grammar::Kind::kSplit:
        for (auto it = n.alts.rbegin(); it != n.alts.rend(); ++it) todo.push_back({*it, t.rs});
        break;
      case Grammar::Kind::kCall: {
        // A call whose continuation is a return needs no frame (tail call): right recursion
        // (repetition written as a rule calling itself) stays in bounded stack depth.
        int32_t rs = t.rs;
        if (g.node(n.next).kind != Grammar::Kind::kReturn) rs = push_frame(n.next, t.rs);
        if (rs < 0) break;  // nested too deep: this path dies
        todo.push_back({g.rule_start(n.callee), rs});
        break;
      }
      case Grammar::Kind::kReturn:
        if (t.rs == 0) todo.push_back({kAccept, 0});
        else todo.push_back({frames_[static_cast<size_t>(t.rs)].ret, frames_[static_cast<size_t>(t.rs)].parent});
        break;
    }
  }
}

int32_t Automaton::intern(std::vector<Thread> threads) {
  std::sort(threads.begin(), threads.end());
  threads.erase(std::unique(threads.begin(), threads.end()), threads.end());
  if (threads.empty() && !states_.empty()) return kDead;
  std::string key(reinterpret_cast<const char*>(threads.data()), threads.size() * sizeof(Thread));
  auto it = state_ids_.find(key);
  if (it != state_ids_.end()) return it->second;
  HEARTH_CHECK(states_.size() < kMaxStates, "grammar: the automaton needs more than ", kMaxStates,
               " states (the schema is too large or too deeply nested)");
  const int32_t id = static_cast<int32_t>(states_.size());
  states_.push_back(std::move(threads));
  table_.resize(states_.size() * nclasses_, kUnknown);
  state_ids_.emplace(std::move(key), id);
  return id;
}

int32_t Automaton::compute(int32_t state, uint8_t byte) {
  std::vector<Thread> next;
  // Copy: closure may intern frames but never touches states_, yet intern() below may grow it.
  const std::vector<Thread> threads = states_[static_cast<size_t>(state)];
  for (const Thread& t : threads) {
    if (t.pc == kAccept) continue;
    const Grammar::Node& n = grammar_->node(t.pc);
    if (n.bytes.test(byte)) closure(n.next, t.rs, next);
  }
  if (next.empty()) return kDead;
  return intern(std::move(next));
}

int32_t Automaton::walk(int32_t state, std::string_view bytes) {
  for (char c : bytes) {
    if (state < 0) return kDead;
    state = step(state, static_cast<uint8_t>(c));
  }
  return state;
}

bool Automaton::accepting(int32_t state) const {
  if (state < 0) return false;
  const auto& th = states_[static_cast<size_t>(state)];
  return !th.empty() && th.front().pc == kAccept;  // kAccept (-1) sorts first
}

bool Automaton::final(int32_t state) const {
  return accepting(state) && states_[static_cast<size_t>(state)].size() == 1;
}

}  // namespace hearth::grammar
