// What transformers 5 does with tokenizer_config.json's `tokenizer_class` before any text is
// encoded: for some classes it rebuilds the pipeline from the config instead of using
// tokenizer.json's verbatim. Not the components themselves (pre_tokenizers.h, decoders.h, ...).
#pragma once
#include <nlohmann/json.hpp>

#include "tokenizer/json_fields.h"

namespace hearth::tokenizer {

/// Rewrites `tokenizer_json` (a parsed tokenizer.json) and `config` (tokenizer_config.json, may be
/// null) the way transformers 5's AutoTokenizer builds the class named by config.tokenizer_class.
/// LlamaTokenizer / LlamaTokenizerFast (transformers models/llama/tokenization_llama.py, v5): no
/// normalizer; pre-tokenizer Metaspace("▁", split=false) with prepend_scheme "always" when
/// add_prefix_space (default true) and legacy (default false), "first" when add_prefix_space and
/// not legacy, "never" without add_prefix_space; decoder Replace("▁"→" "), ByteFallback, Fuse,
/// plus Strip(" ", 1, 0) with add_prefix_space; BPE with byte_fallback and fuse_unk; the
/// post-processor from add_bos_token (default true) / add_eos_token (default false) and the
/// bos/eos tokens (defaults "<s>", "</s>"). Other classes: unchanged (transformers 5 uses their
/// tokenizer.json as written). Throws hearth::Error naming the config field when one has the wrong
/// type.
void apply_tokenizer_class(nlohmann::json& tokenizer_json, nlohmann::json& config, const jf::At& config_at);

}  // namespace hearth::tokenizer
