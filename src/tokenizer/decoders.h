// tokenizer.json "decoder" components (HF tokenizers decoders/): ByteLevel, ByteFallback,
// Metaspace, Fuse, Strip, Replace, BPEDecoder, Sequence. Each maps a list of token strings to a
// new list (HF decode_chain); the final text is their concatenation. Not the id -> token lookup.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_fields.h"

namespace hearth::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  /// HF Decoder::decode_chain. With `raw`, the byte decoders (ByteLevel, ByteFallback) keep the
  /// bytes as they are instead of replacing ill-formed UTF-8 by U+FFFD (for logprob `bytes`).
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens, bool raw) const = 0;
  /// decode_chain, then concatenated (HF Decoder::decode).
  std::string decode(std::vector<std::string> tokens, bool raw = false) const;
};

/// Builds the decoder described by `j`. Throws hearth::Error naming `at` for an unknown type or a
/// missing/bad field.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const jf::At& at);

}  // namespace hearth::tokenizer
