// MarkerStreamDecoder: StreamDecoder(skip specials) with a few special tokens let through.
// Not thread-safe; one per generation.
#include "server/marker_decoder.h"

#include <algorithm>

namespace hearth::server {

std::vector<int32_t> special_marker_ids(const tokenizer::Tokenizer& tok, const std::vector<std::string>& markers) {
  std::vector<int32_t> ids;
  for (const auto& m : markers) {
    if (m.empty()) continue;
    if (auto id = tok.token_to_id(m); id && tok.is_special(*id)) ids.push_back(*id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

MarkerStreamDecoder::MarkerStreamDecoder(const tokenizer::Tokenizer& tok, std::vector<int32_t> visible,
                                         const std::vector<int32_t>& context)
    : tok_(tok), dec_(tok, /*skip_special_tokens=*/true, context), visible_(std::move(visible)) {
  std::sort(visible_.begin(), visible_.end());
}

std::string MarkerStreamDecoder::push(int32_t id) {
  if (std::binary_search(visible_.begin(), visible_.end(), id)) return dec_.flush() + tok_.id_to_token(id);
  return dec_.push(id);
}

std::string MarkerStreamDecoder::flush() { return dec_.flush(); }

}  // namespace hearth::server
