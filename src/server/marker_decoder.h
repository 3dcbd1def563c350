// Streaming detokenization that skips special tokens except a chosen few "markers" (reasoning
// and tool-call delimiters such as Gemma 4's <|channel> / <|tool_call> / <|"|>), whose text is
// emitted in place so the chat parsers can see it. Not a parser: src/chat/ splits the text.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace hearth::server {

/// Ids of those `markers` that are single *special* tokens of `tok` (sorted, unique). Markers that
/// are ordinary or non-special added tokens are left out: they reach the decoded text anyway.
std::vector<int32_t> special_marker_ids(const tokenizer::Tokenizer& tok, const std::vector<std::string>& markers);

/// tokenizer::StreamDecoder with skip_special_tokens, except that ids in `visible` produce their
/// token text (after whatever text the decoder still held, so the order is kept). A visible id
/// ends the decoder's window (StreamDecoder::flush) and decoding resumes fresh after it, which is
/// exact for decoders whose output per token does not depend on its left context (ByteLevel,
/// Gemma's Replace+ByteFallback+Fuse); SentencePiece Metaspace decoders would drop the leading
/// space of the token after a marker. With `visible` empty it is exactly StreamDecoder(tok, true).
/// `context` (e.g. the prompt's last ids) is what the first generated tokens continue, so their
/// text is decoded against it (StreamDecoder's context constructor). Keeps a reference to `tok`.
/// Not thread-safe.
class MarkerStreamDecoder {
 public:
  MarkerStreamDecoder(const tokenizer::Tokenizer& tok, std::vector<int32_t> visible,
                      const std::vector<int32_t>& context = {});
  /// Text completed by `id` (see StreamDecoder::push).
  std::string push(int32_t id);
  /// Held-back text (see StreamDecoder::flush).
  std::string flush();

 private:
  const tokenizer::Tokenizer& tok_;
  tokenizer::StreamDecoder dec_;
  std::vector<int32_t> visible_;  // sorted
};

}  // namespace hearth::server
