// tokenizer.json "post_processor" components (HF tokenizers processors/): TemplateProcessing,
// BertProcessing, RobertaProcessing, ByteLevel (ids unchanged) and Sequence, reduced to what ids
// need: the special tokens placed around one sequence. Not truncation or padding.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "tokenizer/json_fields.h"

namespace hearth::tokenizer {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  /// Returns the final ids for one sequence `ids`; special tokens are placed only when
  /// `add_special_tokens` is true.
  virtual std::vector<int32_t> process(std::vector<int32_t> ids, bool add_special_tokens) const = 0;
};

/// Builds the post-processor described by `j`. Throws hearth::Error naming `at` for an unknown
/// type or a template referring to an undeclared special token.
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j, const jf::At& at);

/// A processor that puts `prefix` before and `suffix` after the sequence (used for
/// tokenizer_config.json add_bos_token / add_eos_token when tokenizer.json has no post-processor).
std::unique_ptr<PostProcessor> make_affix_processor(std::vector<int32_t> prefix, std::vector<int32_t> suffix);

}  // namespace hearth::tokenizer
