// hearth::tokenizer::Tokenizer: loads a Hugging Face tokenizer.json (+ tokenizer_config.json) and
// encodes/decodes exactly as HF `tokenizers` does (BPE models only), plus StreamDecoder for
// incremental detokenization. Not a chat-template renderer (chat/ does that with chat_template()).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hearth::tokenizer {

class Tokenizer {
 public:
  /// Loads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json and
  /// `dir`/chat_template.jinja. Throws hearth::Error naming the file (and field) when a file is
  /// missing, is not JSON, or describes something unsupported or inconsistent; hearth::NotFound
  /// ("DIR: model folder not found") when `dir` does not exist, InvalidArgument when it is a file.
  static Tokenizer from_dir(const std::filesystem::path& dir);
  /// Loads the given files; `tokenizer_config_json` may be an empty path (then no config). A
  /// chat_template.jinja beside the config file is read too. Errors as from_dir.
  static Tokenizer from_files(const std::filesystem::path& tokenizer_json,
                              const std::filesystem::path& tokenizer_config_json);
  /// Loads from in-memory JSON text; `origin` names it in error messages. `config_text` may be
  /// empty (no tokenizer_config.json). This is the fuzzing entry point.
  static Tokenizer from_json_text(std::string_view tokenizer_json_text, const std::string& origin,
                                  std::string_view config_text = {}, const std::string& config_origin = {});

  /// Token ids of `text` (UTF-8; ill-formed bytes are read as U+FFFD), HF
  /// `Tokenizer.encode(text, add_special_tokens).ids`. With add_special_tokens the post-processor
  /// (e.g. BOS) is applied; added tokens written in the text are always recognized.
  /// Thread-safe. Throws hearth::Error only for a broken vocab (unk token missing from it).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  /// Text of `ids`, HF `Tokenizer.decode(ids, skip_special_tokens)`: unknown ids are skipped, and
  /// with skip_special_tokens so are special added tokens. Always valid UTF-8. Thread-safe.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;

  /// decode() without its final UTF-8 repair: the raw bytes the ids stand for, so byte-fallback
  /// tokens ("<0xE9>") and byte-level pieces give their own bytes even when they are not valid
  /// UTF-8 on their own (OpenAI logprobs `bytes`). Thread-safe.
  std::string decode_bytes(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  /// What token `id` adds to the text after `context` (the ids before it; a few are enough), as
  /// vLLM and HF detokenize a continuation: decode(context + id) minus decode(context), on raw
  /// bytes (decode_bytes, special tokens kept). So "▁and" after other tokens is " and" (a
  /// SentencePiece decoder drops the space only at the start of a text) and "<0xE9>" is "é".
  /// Falls back to the token decoded alone when decode(context) is not a prefix. Thread-safe.
  std::string continuation_bytes(const std::vector<int32_t>& context, int32_t id) const;

  /// Id of a token string (added tokens first, then the model vocab).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// Token string of `id` ("" when there is none).
  std::string id_to_token(int32_t id) const;
  /// One past the largest id of the model vocab and the added tokens (the V an embedding needs).
  int32_t vocab_size() const;
  /// Ids of the config's bos_token / eos_token, when it names one that exists.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  /// True when `id` is a special added token.
  bool is_special(int32_t id) const;
  /// The chat template (chat_template.jinja, else the config's "default" one); "" when none.
  const std::string& chat_template() const;
  /// The config's bos_token / eos_token text ("" when none).
  std::string bos_token() const;
  std::string eos_token() const;
  /// The config's model_max_length, when present and an integer.
  std::optional<int64_t> model_max_length() const;

  struct Impl;

 private:
  std::string decode_impl(const std::vector<int32_t>& ids, bool skip_special_tokens, bool raw) const;
  std::shared_ptr<const Impl> impl_;
};

/// Incremental detokenizer (HF DecodeStream / mlx-lm streaming detokenizer): push ids one at a
/// time and get only text that is complete and will not change, never a broken UTF-8 sequence.
/// The concatenation of every push() result and flush() equals tokenizer.decode(all ids) whenever
/// decoding is prefix-stable; the one known exception (as in HF) is a ByteFallback byte run that
/// completes a character and then turns invalid as a whole, which decode() renders as one U+FFFD
/// per byte after the character was already streamed; flush() then returns the window's own text.
/// Keeps a reference to the Tokenizer, which must outlive it. Not thread-safe (one per stream).
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);
  /// A stream that continues `context` (e.g. the prompt's ids; its last few are used): the first
  /// pushed id decodes as decode(context + id) minus decode(context), so a SentencePiece token
  /// "▁a" after a prompt yields " a", not "a" (vLLM's incremental detokenizer does the same).
  /// The context's own text is never returned.
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens, const std::vector<int32_t>& context);
  /// Adds `id`; returns the newly completed text (often "", e.g. inside a multi-byte character).
  std::string push(int32_t id);
  /// Returns whatever text is still held back (e.g. an incomplete byte sequence, as U+FFFD) and
  /// resets the stream.
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_;
  std::vector<int32_t> all_;     // every id pushed since the last flush
  std::vector<int32_t> window_;  // ids whose decoding starts with prefix_
  std::string prefix_;           // decode(window_[0, prefix_index_))
  size_t prefix_index_ = 0;
  std::string emitted_;          // text returned since the last flush
};

}  // namespace hearth::tokenizer
