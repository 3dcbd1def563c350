// Stop strings with hold-back: finds the first stop string in streamed, decoded text and holds
// back any tail that could still grow into one. Works on text (bytes of UTF-8), not token ids.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace hearth::generate {

/// Matches stop strings in text that arrives piece by piece (one detokenized token at a time).
/// Text that cannot be part of a stop string is released at once; a tail that is a proper prefix
/// of some stop string is held back until it either completes a match (then it is dropped with
/// everything after it) or stops matching (then it is released). `flush()` releases what is
/// held when generation ends without a match. Follows OpenAI/mlx-lm semantics: the earliest match
/// in the text wins (ties: the stop listed first); the stop string itself is not returned.
/// Pieces should be whole UTF-8 characters; then every returned string is valid UTF-8 too.
class StopMatcher {
 public:
  /// `stops`: the stop strings; empty strings are ignored (OpenAI drops them).
  explicit StopMatcher(std::vector<std::string> stops);

  /// What one push released.
  struct Result {
    std::string text;       ///< text safe to emit now (before any match)
    bool stopped = false;   ///< a stop string completed in this push
    size_t stop_index = 0;  ///< index into the constructor's list (after dropping empties)
    std::string rest;       ///< when stopped: the text after the match in the held buffer
  };

  /// Appends `piece` and returns what can be emitted. After a match, every later push returns
  /// an empty result with `stopped` false (the caller should have stopped generating).
  Result push(std::string_view piece);

  /// Releases the held-back tail (call once when generation ends without a match).
  std::string flush();

  /// True once a stop string has matched.
  bool stopped() const { return stopped_; }
  /// The stop strings in use (empties dropped).
  const std::vector<std::string>& stops() const { return stops_; }
  /// Bytes currently held back.
  size_t held() const { return buffer_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string buffer_;  // held-back text: a proper prefix of some stop string
  bool stopped_ = false;
};

}  // namespace hearth::generate
