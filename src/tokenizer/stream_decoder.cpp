// StreamDecoder: incremental detokenization by decoding a short sliding window of ids and emitting
// only the stable new suffix (the approach of HF tokenizers' DecodeStream::step). Not a decoder
// component; it calls Tokenizer::decode.
#include "tokenizer/tokenizer.h"

#include <algorithm>

namespace hearth::tokenizer {

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && std::string_view(s).substr(s.size() - 3) == kReplacement;
}
}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(&tokenizer), skip_(skip_special_tokens) {}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens, const std::vector<int32_t>& context)
    : tok_(&tokenizer), skip_(skip_special_tokens) {
  constexpr size_t kContext = 4;  // enough for every decoder's start-of-text rule
  const size_t n = std::min(context.size(), kContext);
  std::vector<int32_t> tail(context.end() - static_cast<std::ptrdiff_t>(n), context.end());
  std::string text = tok_->decode(tail, skip_);
  if (tail.empty() || text.empty() || ends_with_replacement(text)) return;  // no usable context
  all_ = tail;
  window_ = std::move(tail);
  prefix_ = text;
  prefix_index_ = window_.size();
  emitted_ = std::move(text);
}

std::string StreamDecoder::push(int32_t id) {
  all_.push_back(id);
  if (prefix_.empty() && !window_.empty()) {
    std::string p = tok_->decode(window_, skip_);
    if (!ends_with_replacement(p)) {
      prefix_ = std::move(p);
      prefix_index_ = window_.size();
    }
  }
  window_.push_back(id);
  std::string s = tok_->decode(window_, skip_);
  if (s.size() <= prefix_.size() || ends_with_replacement(s)) return "";
  if (s.compare(0, prefix_.size(), prefix_) != 0) {
    // The window's text changed before its end (a decoder that is not prefix-stable): resync on
    // the full text so the stream still adds up to decode(all ids).
    std::string full = tok_->decode(all_, skip_);
    if (ends_with_replacement(full) || full.size() <= emitted_.size() ||
        full.compare(0, emitted_.size(), emitted_) != 0)
      return "";
    std::string out = full.substr(emitted_.size());
    emitted_ = full;
    window_.assign(all_.end() - 1, all_.end());
    prefix_ = tok_->decode(window_, skip_);
    prefix_index_ = window_.size();
    return out;
  }
  std::string out = s.substr(prefix_.size());
  size_t new_prefix_index = window_.size() - prefix_index_;
  window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tok_->decode(window_, skip_);
  prefix_index_ = new_prefix_index;
  emitted_ += out;
  return out;
}

std::string StreamDecoder::flush() {
  std::string full = tok_->decode(all_, skip_);
  std::string out;
  if (full.compare(0, emitted_.size(), emitted_) == 0) {
    out = full.substr(emitted_.size());
  } else if (!window_.empty()) {
    std::string w = tok_->decode(window_, skip_);
    if (w.size() > prefix_.size() && w.compare(0, prefix_.size(), prefix_) == 0) out = w.substr(prefix_.size());
  }
  all_.clear();
  window_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  emitted_.clear();
  return out;
}

}  // namespace hearth::tokenizer
