// tokenizer.json "normalizer" components (HF tokenizers normalizers/): NFC/NFD/NFKC/NFKD,
// Lowercase, Strip, StripAccents, Replace, Prepend, ByteLevel and Sequence. They rewrite text only;
// offsets are not tracked (Hearth needs ids, not alignments). Not the pre-tokenizers.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"

namespace hearth::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  /// Rewrites `s` (valid UTF-8) in place.
  virtual void normalize(std::string& s) const = 0;
};

/// Builds the normalizer described by `j` (an object with "type"). Throws hearth::Error naming
/// `at` for an unknown type, a missing field or a bad regex.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const jf::At& at);

/// A Replace/Split "pattern" object: {"String": literal} or {"Regex": oniguruma pattern}.
Regex make_pattern(const nlohmann::json& p, const jf::At& at);

}  // namespace hearth::tokenizer
