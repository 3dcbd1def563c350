// The longest context a model folder supports, derived from its config.json the way vLLM derives
// max_model_len, and the start-up check of `--context-length` against it. Not the context the
// server uses (ModelEngine::context_length) and not RoPE itself (models/).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace hearth::server {

/// What config.json says about the model's longest context.
struct ContextLimit {
  int64_t tokens = 0;       ///< the limit; 0 = config.json names none (no check is possible)
  std::string explanation;  ///< how it was derived, e.g. "max_position_embeddings 2048" or
                            ///< "rope_scaling yarn: original_max_position_embeddings 32768 x factor 4"
};

/// vLLM's derivation (_get_and_verify_max_len / get_max_model_len), on the text config
/// (config.json's text_config when it has one, else the top level): the smallest of
/// max_position_embeddings, n_positions, max_seq_len, seq_length, max_sequence_length,
/// max_seq_length and seq_len present; then RoPE scaling (rope_scaling, transformers 4.x, or
/// rope_parameters, 5.x, flat or one object per layer type) of a type other than "default",
/// "su", "longrope" and "llama3" (whose max_position_embeddings is already the scaled length)
/// multiplies it by its `factor`, yarn starting from its original_max_position_embeddings when
/// given. Gemma models (model_type starting "gemma") are not scaled: their
/// max_position_embeddings is already the scaled length (vLLM skips gemma3 for this reason).
/// Never throws on odd values: a key of the wrong type is ignored.
ContextLimit derive_context_limit(const nlohmann::json& config);

/// The start-up check (like vLLM's refusal of a max_model_len above the derived one): "" when
/// `requested` is 0 (the default), within `limit`, `limit` is unknown, or `allow_longer`;
/// otherwise the one-line error naming both numbers, where the limit comes from, the flag and
/// the opt-in (--allow-long-context or HEARTH_ALLOW_LONG_CONTEXT=1).
std::string context_length_error(int64_t requested, const ContextLimit& limit, bool allow_longer);

/// Whether HEARTH_ALLOW_LONG_CONTEXT is set to 1 (or "true") in the environment.
bool long_context_allowed_by_env();

}  // namespace hearth::server
