// PEFT's rank_pattern / alpha_pattern keys: regular expressions over module names, matched as
// peft.utils.other.get_pattern_key does, with a bounded matcher (a key written to backtrack
// forever is refused, never run to the end). Not target_modules matching (adapter.h key_matches).
#pragma once
#include <memory>
#include <string>

namespace hearth::adapters {

/// One compiled pattern key. Semantics of get_pattern_key: re.match(rf"(.*\.)?({key})$", module),
/// i.e. `key` (a Python-style regex) matches the whole module name or a suffix of it that starts
/// after a '.'. Matching runs PCRE2 with a match limit (10^6 backtracking steps) and a depth
/// limit, so any key costs at most ~10 ms per module.
class PatternKey {
 public:
  /// Compiles `key`; throws hearth::Error "<where>: <field> key '<key>' is not a valid regular
  /// expression (<PCRE2 message>)", or "... is longer than 1000 characters".
  PatternKey(const std::string& key, const std::string& where, const char* field);
  ~PatternKey();
  PatternKey(PatternKey&&) noexcept;
  PatternKey& operator=(PatternKey&&) noexcept;

  /// Whether `module` matches. Throws hearth::Error "<where>: <field> key '<key>' is too costly to
  /// match (catastrophic backtracking on <module>); write it without nested repetition" when the
  /// limits are hit.
  bool matches(const std::string& module) const;
  const std::string& key() const { return key_; }

 private:
  struct Code;
  std::unique_ptr<Code> code_;
  std::string key_, where_, field_;
};

}  // namespace hearth::adapters
