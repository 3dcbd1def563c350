// The chunking task's scoring: a model's output must be a JSON array of strings (the paragraph's
// sentences); per example, F1 of exactly matching sentences against the reference. Also the
// reader of the task's jsonl rows. Not generation (`hearth eval chunk` drives the engine) and not
// the dataset builder (tools/build_chunk_dataset.mjs).
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hearth::eval {

/// `text` parsed as a JSON array of strings (surrounding whitespace allowed); nullopt when it is
/// not valid JSON, not an array, or has a non-string element. Never throws.
std::optional<std::vector<std::string>> parse_sentence_array(std::string_view text);

/// F1 of exactly matching sentences: each sentence trimmed of ASCII whitespace, matches counted
/// as a multiset intersection (a sentence predicted twice but present once matches once);
/// precision = matches / |predicted|, recall = matches / |reference|, F1 = 2PR / (P + R)
/// = 2·matches / (|predicted| + |reference|). Both empty → 1; exactly one empty → 0.
double sentence_f1(const std::vector<std::string>& predicted, const std::vector<std::string>& reference);

/// One scored output: valid_json false (and f1 0) when the output is not a JSON array of strings.
struct ChunkScore {
  bool valid_json = false;
  double f1 = 0.0;
};

/// Scores a model's raw output against the reference sentences.
ChunkScore score_chunk_output(std::string_view output, const std::vector<std::string>& reference);

/// One evaluation example: the user prompt and the reference sentences.
struct ChunkExample {
  std::string prompt;
  std::vector<std::string> reference;
};

/// Reads the task's jsonl: {"prompt", "completion"} rows, or {"messages"} rows (prompt = the last
/// user message before the last assistant message, completion = that assistant message); the
/// completion must be a JSON array of strings. At most `max_examples` rows (0 = all), in file
/// order. Throws hearth::Error "<file>:<line>: <problem>" on a malformed row, and when the file
/// is missing or has no rows.
std::vector<ChunkExample> load_chunk_examples(const std::filesystem::path& path, int64_t max_examples = 0);

}  // namespace hearth::eval
