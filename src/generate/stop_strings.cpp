// StopMatcher: earliest-match search over held-back text plus the newest piece.
// Not a tokenizer-level matcher: stop token ids (EOS) are handled by the generation loop.
#include "generate/stop_strings.h"

#include <algorithm>

namespace hearth::generate {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopMatcher::Result StopMatcher::push(std::string_view piece) {
  Result r;
  if (stopped_) return r;
  if (stops_.empty()) {
    r.text.assign(piece);
    return r;
  }
  buffer_.append(piece);
  // Earliest full match wins; among matches starting at the same byte, the first listed.
  size_t best = std::string::npos, best_i = 0;
  for (size_t i = 0; i < stops_.size(); ++i) {
    size_t p = buffer_.find(stops_[i]);
    if (p < best) best = p, best_i = i;
  }
  if (best != std::string::npos) {
    stopped_ = true;
    r.stopped = true;
    r.stop_index = best_i;
    r.text = buffer_.substr(0, best);
    r.rest = buffer_.substr(best + stops_[best_i].size());
    buffer_.clear();
    return r;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    size_t max_len = std::min(s.size() - 1, buffer_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (std::string_view(buffer_).substr(buffer_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  r.text = buffer_.substr(0, buffer_.size() - hold);
  buffer_.erase(0, buffer_.size() - hold);
  return r;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(buffer_);
  buffer_.clear();
  return out;
}

}  // namespace hearth::generate
