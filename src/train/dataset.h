// Fine-tuning data: train.jsonl / valid.jsonl rows ({"messages"}, {"prompt","completion"}, {"text"})
// tokenized into examples with a prompt length, and the batcher (length-sorted windows, shuffled
// per epoch with the seed, right-padded, labels -100 off the loss). Not the loss (loss.h).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace hearth::train {

/// Row format of a jsonl file, detected from its first row (mlx-lm create_dataset order:
/// prompt+completion, then messages, then text); every row must then have the same keys.
enum class DataFormat { kCompletion, kChat, kText };

/// One tokenized example: loss on tokens[j] for prompt_len <= j < tokens.size(), or, when
/// loss_mask is not empty (same length as tokens), exactly on the tokens j with loss_mask[j] = 1.
struct Example {
  std::vector<int32_t> tokens;
  int64_t prompt_len = 0;
  std::vector<uint8_t> loss_mask;  // chat templates with {% generation %} blocks
};

/// How rows become token ids.
struct DataOptions {
  int64_t max_seq_length = 2048;  // longer examples are truncated (first tokens kept)
  /// Text rows: pack all rows (each + EOS) into one stream cut into max_seq_length pieces
  /// (for full fine-tuning; mlx-lm does not pack).
  bool pack_text = false;
};

/// A tokenized jsonl file.
struct Dataset {
  DataFormat format = DataFormat::kText;
  std::vector<Example> examples;
  /// Rows left out because no token of theirs is a target: the prompt alone fills
  /// max_seq_length (after truncation nothing of the answer is left).
  int64_t skipped_no_target = 0;
};

/// Number of leading ids `a` and `b` share (where a rendered prompt stops matching the whole
/// rendered conversation: the prompt/response boundary of a training row).
int64_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

/// Tokenizes one jsonl file, following mlx-lm's tuner/datasets.py:
/// - {"messages": [...], "tools"?}: full = chat template over all messages
///   (add_generation_prompt=false); prompt = the template over the messages before the LAST
///   assistant message with add_generation_prompt=true; tokens = encode(full, no specials);
///   prompt_len = common prefix of encode(prompt) and tokens (mlx-lm uses len(encode(prompt)),
///   equal when the prompt tokenizes as a prefix). Loss on the last assistant turn and after.
///   When the template has {% generation %} blocks, the loss is instead on exactly the tokens of
///   those blocks' output (transformers' apply_chat_template(return_assistant_tokens_mask=True):
///   the blocks' byte spans mapped to tokens via their decoded offsets) — every assistant turn
///   the template marks. Messages with content null/missing get content "" (as the server).
/// - {"prompt", "completion"}: with a chat template, as messages [user: prompt, assistant:
///   completion] (mlx-lm); without one, text concatenation prompt + completion encoded with
///   special tokens, EOS appended when missing, prompt_len = common prefix with encode(prompt).
/// - {"text"}: encode(text, with specials) + EOS when missing; prompt_len 0.
/// The mask is always applied to messages / prompt-completion rows (the trainer's choice, see
/// TrainConfig). A row whose kept tokens have no target (its prompt reaches max_seq_length, or its
/// generation blocks were cut off) is skipped and counted in Dataset::skipped_no_target. Throws
/// hearth::Error "<file>:<line>: <problem>" on malformed JSON, missing or mistyped keys, a
/// conversation without an assistant message, a row nested deeper than kMaxNesting; "<file>: ..."
/// for an empty file or one where no row has a target token.
Dataset load_jsonl(const std::filesystem::path& path, const tokenizer::Tokenizer& tok, const DataOptions& opts);

/// One padded batch. input_ids [B, T] int64 (pad id 0), labels [B, T] int64 with kIgnoreIndex on
/// the prompt and on padding (pass through shift_labels for next-token targets).
struct Batch {
  at::Tensor input_ids;
  at::Tensor labels;
  int64_t n_tokens = 0;  // real (non-pad) tokens
};

/// Builds a batch from examples (right padding to the longest). Throws on an empty list.
Batch make_batch(const std::vector<const Example*>& rows);

/// mlx-lm's iterate_batches order: examples sorted by length (stable), cut into consecutive
/// windows of batch_size (a short tail is dropped unless keep_tail), window order shuffled per epoch by a
/// Fisher-Yates shuffle driven by mt19937_64(seed + epoch). The position is (epoch, index),
/// so a resumed run continues the same sequence without saving RNG state.
class Batcher {
 public:
  /// Throws hearth::Error when the dataset has fewer than batch_size examples (keep_tail: none).
  /// keep_tail: the last window holds the n % batch_size longest examples (evaluation over all).
  Batcher(const Dataset& data, int64_t batch_size, uint64_t seed, bool shuffle = true, bool keep_tail = false);
  /// The same order over items of the given lengths (e.g. preference pairs, each by its longer
  /// sequence); only next_indices() may be used. Throws as above.
  Batcher(const std::vector<int64_t>& lengths, int64_t batch_size, uint64_t seed, bool shuffle = true,
          bool keep_tail = false);
  /// The next batch, looping over epochs (throws for a Batcher made from lengths).
  Batch next();
  /// The item indices of the next batch, looping over epochs.
  std::vector<int64_t> next_indices();
  int64_t num_batches() const { return static_cast<int64_t>(windows_.size()); }
  int64_t epoch() const { return epoch_; }
  int64_t index() const { return index_; }
  /// Moves to (epoch, index) as reported by epoch()/index(); throws when index is out of range.
  void seek(int64_t epoch, int64_t index);

 private:
  void reorder();
  const Dataset* data_ = nullptr;
  uint64_t seed_;
  bool shuffle_;
  std::vector<std::vector<int64_t>> windows_;  // example indices per batch, sorted order
  std::vector<int64_t> order_;                 // window order of the current epoch
  int64_t epoch_ = 0, index_ = 0;
};

}  // namespace hearth::train
