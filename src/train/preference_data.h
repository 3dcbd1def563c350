// Preference data for DPO / ORPO: train.jsonl rows {"prompt", "chosen", "rejected"} tokenized into
// (chosen, rejected) example pairs with a prompt length, and their padded batches. Follows
// mlx-bun's tokenizePair (inventory §5.1). Not the losses (preference.h) or SFT data (dataset.h).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "train/dataset.h"

namespace hearth::train {

/// One tokenized preference row: the prompt's tokens followed by each response; the loss is on
/// tokens[j] for j >= prompt_len of each (Example::loss_mask is empty).
struct PreferencePair {
  Example chosen, rejected;
};

/// A tokenized preference file.
struct PreferenceDataset {
  std::vector<PreferencePair> pairs;
  /// Pairs where left truncation to max_seq_length dropped the whole prompt of a sequence (the
  /// loss then covers what is left of the response alone; mlx-bun warns the same way).
  int64_t prompt_dropped = 0;
  /// Per pair, the longer of its two sequences (the batcher's sort key).
  std::vector<int64_t> lengths() const;
};

/// Tokenizes a preference jsonl file. Each row: "prompt" as a string (used raw: encoded with the
/// tokenizer's special tokens) or as a messages array (also accepted under "messages"; rendered
/// with the chat template, add_generation_prompt=true, enable_thinking=false, encoded without
/// specials); "chosen" / "rejected" as a string (the continuation text), an assistant message
/// object, or a one-message array holding it (TRL's conversational form; needs a messages prompt);
/// optional "tools" passed to the template.
/// - A string response: full = encode(prompt_text + response); when the prompt's ids are not a
///   prefix of it, full = prompt ids + encode(response, no specials). EOS appended when missing.
/// - A message response: full = the template over prompt messages + the message
///   (add_generation_prompt=false), prompt_len = common prefix with the prompt's ids (as SFT).
/// A doubled leading BOS (template text + tokenizer) is reduced to one. A sequence longer than
/// max_seq_length is cut from the left (mlx-bun): the prompt loses its first tokens; when the
/// excess reaches the prompt length, the last max_seq_length tokens are kept with prompt_len 0
/// (counted in prompt_dropped). Throws hearth::Error "<file>:<line>: \"<field>\": <problem>" for
/// malformed JSON, a missing or mistyped field, an empty response, a message response with a text
/// prompt; "<file>: no rows" for an empty file.
PreferenceDataset load_preference_jsonl(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                                        int64_t max_seq_length);

/// A padded preference batch of B pairs: rows [0, B) are the chosen sequences, [B, 2B) the
/// rejected ones (TRL's concatenated forward), right-padded with id 0 to the longest of all 2B.
struct PreferenceBatch {
  at::Tensor input_ids;    // [2B, T] int64
  at::Tensor labels;       // [2B, T] int64: the response tokens, kIgnoreIndex elsewhere
  at::Tensor full_labels;  // [2B, T] int64: every real token (prompt too), kIgnoreIndex on padding
  int64_t pairs = 0;       // B
};

/// Builds the batch of the given pairs (indices into data.pairs). Throws on an empty list.
PreferenceBatch make_preference_batch(const PreferenceDataset& data, const std::vector<int64_t>& indices);

}  // namespace hearth::train
