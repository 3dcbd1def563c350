// jsonl fine-tuning data: format detection, tokenization with prompt masks, batching (dataset.h).
#include "train/dataset.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>

#include "chat/chat_template.h"
#include "core/error.h"
#include "core/json_nesting.h"
#include "train/loss.h"

namespace hearth::train {

namespace {

using ojson = nlohmann::ordered_json;


DataFormat detect(const ojson& row) {
  if (row.contains("prompt") && row.contains("completion")) return DataFormat::kCompletion;
  if (row.contains("messages")) return DataFormat::kChat;
  if (row.contains("text")) return DataFormat::kText;
  if (row.contains("chosen") && row.contains("rejected"))
    throw Error("a preference row (\"chosen\"/\"rejected\"): train it with --method dpo or --method orpo");
  throw Error("no \"prompt\"+\"completion\", \"messages\" or \"text\" key");
}

const std::string& need_string(const ojson& row, const char* key) {
  auto it = row.find(key);
  if (it == row.end()) throw Error(cat("missing key \"", key, "\""));
  if (!it->is_string()) throw Error(cat("\"", key, "\" must be a string"));
  return it->get_ref<const std::string&>();
}

void append_eos(std::vector<int32_t>& ids, const tokenizer::Tokenizer& tok) {
  if (auto eos = tok.eos_id(); eos && (ids.empty() || ids.back() != *eos)) ids.push_back(*eos);
}

// The parsed chat template, shared by the rows of one file (parsed on first use).
struct TemplateCache {
  const tokenizer::Tokenizer& tok;
  std::optional<chat::ChatTemplate> tmpl;
  const chat::ChatTemplate& get() {
    if (!tmpl) tmpl.emplace(tok.chat_template());
    return *tmpl;
  }
};

chat::ChatInputs chat_inputs(const tokenizer::Tokenizer& tok, const ojson& messages, const ojson& tools, bool gen_prompt) {
  chat::ChatInputs in;
  in.messages = messages;
  in.tools = tools;
  in.add_generation_prompt = gen_prompt;
  in.bos_token = tok.bos_token();
  in.eos_token = tok.eos_token();
  in.null_content_as_empty = true;  // as the server (vLLM): tool-call turns with content null
  return in;
}

// Byte range [begin, end) of each token of `ids` in `text` (= the text ids were encoded from):
// the streaming detokenizer's pieces (decode(previous + id) minus decode(previous)), aligned to
// `text` allowing the spaces a SentencePiece decoder adds or drops. Throws when the decoded text
// differs from `text` otherwise (a normalizer that changes characters).
std::vector<std::pair<size_t, size_t>> token_ranges(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids,
                                                    const std::string& text) {
  tokenizer::StreamDecoder sd(tok, /*skip_special_tokens=*/false);
  std::string decoded;
  std::vector<size_t> dec_end(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    decoded += sd.push(ids[i]);
    dec_end[i] = decoded.size();
  }
  decoded += sd.flush();
  if (!ids.empty()) dec_end.back() = decoded.size();
  std::vector<size_t> to_text(decoded.size() + 1);  // decoded offset -> text offset
  size_t i = 0, j = 0;
  while (j < decoded.size()) {
    if (i < text.size() && text[i] == decoded[j]) {
      to_text[j++] = i++;
    } else if (decoded[j] == ' ') {
      to_text[j++] = i;  // a space the decoder added
    } else if (i < text.size() && text[i] == ' ') {
      ++i;  // a space the decoder dropped
    } else {
      throw Error("the chat template has {% generation %} blocks, but the tokenizer does not decode the rendered "
                  "text back to itself, so the blocks cannot be mapped to tokens");
    }
  }
  to_text[decoded.size()] = text.size();
  std::vector<std::pair<size_t, size_t>> out(ids.size());
  size_t prev = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    out[k] = {to_text[prev], to_text[dec_end[k]]};
    prev = dec_end[k];
  }
  return out;
}

// transformers' assistant mask: for each generation span [s, e), the tokens from the one holding
// byte s to the one holding byte e - 1 (char_to_token), inclusive.
std::vector<uint8_t> generation_mask(const std::vector<std::pair<size_t, size_t>>& ranges,
                                     const std::vector<std::pair<size_t, size_t>>& spans) {
  std::vector<uint8_t> mask(ranges.size(), 0);
  for (const auto& [s, e] : spans) {
    if (e <= s) continue;
    size_t first = 0;
    while (first < ranges.size() && ranges[first].second <= s) ++first;  // first token ending after s
    if (first == ranges.size()) break;                                    // past the end (transformers: break)
    size_t last = first;
    for (size_t k = first; k < ranges.size() && ranges[k].first < e; ++k)
      if (ranges[k].second > ranges[k].first) last = k;  // last token with text starting before e
    for (size_t k = first; k <= last; ++k) mask[k] = 1;
  }
  return mask;
}

Example chat_example(const ojson& messages, const ojson& tools, const tokenizer::Tokenizer& tok, TemplateCache& tc) {
  if (!messages.is_array() || messages.empty()) throw Error("\"messages\" must be a non-empty array");
  int64_t last = -1;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw Error(cat("messages[", i, "] must be an object with a string \"role\""));
    if (m["role"] == "assistant") last = static_cast<int64_t>(i);
  }
  if (last < 0) throw Error("\"messages\" has no assistant message to train on");
  if (tok.chat_template().empty()) throw Error("the tokenizer has no chat template for \"messages\" rows");
  const chat::ChatTemplate& tmpl = tc.get();
  Example ex;
  if (tmpl.has_generation_blocks()) {
    // transformers' return_assistant_tokens_mask: the loss is on exactly the generation blocks.
    chat::RenderedChat r = tmpl.render_with_spans(chat_inputs(tok, messages, tools, false));
    ex.tokens = tok.encode(r.text, false);
    ex.loss_mask = generation_mask(token_ranges(tok, ex.tokens, r.text), r.generation_spans);
    return ex;
  }
  // Turns after the last assistant message (a trailing user turn, a tool result) are not rendered:
  // unmasked, they were trained on as if the assistant had written them, and they cannot change
  // the loss of the turn before them (the model is causal).
  ojson upto = ojson::array();
  for (int64_t i = 0; i <= last; ++i) upto.push_back(messages[i]);
  ex.tokens = tok.encode(tmpl.render(chat_inputs(tok, upto, tools, false)), false);
  if (last > 0) {
    ojson before = ojson::array();
    for (int64_t i = 0; i < last; ++i) before.push_back(messages[i]);
    ex.prompt_len = common_prefix(tok.encode(tmpl.render(chat_inputs(tok, before, tools, true)), false), ex.tokens);
  }
  return ex;
}

Example row_example(DataFormat f, const ojson& row, const tokenizer::Tokenizer& tok, TemplateCache& tc) {
  const ojson tools = row.contains("tools") ? row["tools"] : ojson();
  switch (f) {
    case DataFormat::kChat:
      if (!row.contains("messages")) throw Error("missing key \"messages\" (the file's first row has it)");
      return chat_example(row["messages"], tools, tok, tc);
    case DataFormat::kCompletion: {
      const std::string& prompt = need_string(row, "prompt");
      const std::string& completion = need_string(row, "completion");
      if (!tok.chat_template().empty()) {
        ojson msgs = ojson::array({ojson{{"role", "user"}, {"content", prompt}},
                                   ojson{{"role", "assistant"}, {"content", completion}}});
        return chat_example(msgs, tools, tok, tc);
      }
      Example ex;
      ex.tokens = tok.encode(prompt + completion, true);
      append_eos(ex.tokens, tok);
      ex.prompt_len = common_prefix(tok.encode(prompt, true), ex.tokens);
      return ex;
    }
    case DataFormat::kText: {
      Example ex;
      ex.tokens = tok.encode(need_string(row, "text"), true);
      append_eos(ex.tokens, tok);
      return ex;
    }
  }
  throw Error("unknown data format");
}

}  // namespace

int64_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return static_cast<int64_t>(n);
}

Dataset load_jsonl(const std::filesystem::path& path, const tokenizer::Tokenizer& tok, const DataOptions& opts) {
  HEARTH_CHECK(opts.max_seq_length >= 2, "data: max_seq_length must be >= 2, got ", opts.max_seq_length);
  std::ifstream in(path);
  HEARTH_CHECK(in, path.string(), ": cannot open");
  const std::string name = path.filename().string();
  Dataset ds;
  bool first = true;
  std::string line;
  std::vector<int32_t> stream;  // packed text
  TemplateCache templ{tok, std::nullopt};
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      ojson row;
      if (auto deep = json_nesting_violation(line)) throw Error(json_nesting_message("row", *deep));
      try {
        row = ojson::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw Error(cat("not valid JSON (", e.what(), ")"));
      }
      if (!row.is_object()) throw Error("row must be a JSON object");
      if (first) ds.format = detect(row);
      first = false;
      Example ex = row_example(ds.format, row, tok, templ);
      if (ex.tokens.size() < 2) throw Error("fewer than 2 tokens: nothing to predict");
      if (opts.pack_text && ds.format == DataFormat::kText) {
        stream.insert(stream.end(), ex.tokens.begin(), ex.tokens.end());
        continue;
      }
      // Targets are tokens[j] for max(prompt_len, 1) <= j < size (tokens[0] is never predicted),
      // or with generation blocks the masked j >= 1: a row whose kept tokens have none (a prompt
      // that fills them, blocks cut off) would teach nothing.
      const auto has_target = [](const Example& e) {
        return e.loss_mask.empty()
                   ? std::max<int64_t>(e.prompt_len, 1) < static_cast<int64_t>(e.tokens.size())
                   : std::find(e.loss_mask.begin() + 1, e.loss_mask.end(), uint8_t{1}) != e.loss_mask.end();
      };
      if (!has_target(ex))  // before any cut: the template itself gives the answer no token
        throw Error(ex.loss_mask.empty()
                        ? "the chat template renders nothing for the last assistant turn after the prompt (no token to train on)"
                        : "the chat template's {% generation %} blocks hold no token of this row (no token to train on)");
      if (static_cast<int64_t>(ex.tokens.size()) > opts.max_seq_length) {
        ex.tokens.resize(opts.max_seq_length);
        if (!ex.loss_mask.empty()) ex.loss_mask.resize(opts.max_seq_length);
      }
      if (!has_target(ex)) {
        ++ds.skipped_no_target;
        continue;
      }
      ex.prompt_len = std::min<int64_t>(ex.prompt_len, static_cast<int64_t>(ex.tokens.size()) - 1);
      ds.examples.push_back(std::move(ex));
    } catch (const Error& e) {
      throw Error(cat(name, ":", lineno, ": ", e.what()));
    }
  }
  HEARTH_CHECK(!first, path.string(), ": no rows");
  HEARTH_CHECK(!ds.examples.empty() || ds.skipped_no_target == 0 || !stream.empty(), path.string(),
               ": no row has a token to train on: the prompts of all ", ds.skipped_no_target,
               " rows fill max_seq_length (--max-seq-length) ", opts.max_seq_length);
  for (size_t s = 0; s + 1 < stream.size(); s += opts.max_seq_length) {
    const size_t e = std::min(stream.size(), s + opts.max_seq_length);
    if (e - s < 2) break;
    ds.examples.push_back(Example{std::vector<int32_t>(stream.begin() + s, stream.begin() + e), 0, {}});
  }
  return ds;
}

Batch make_batch(const std::vector<const Example*>& rows) {
  HEARTH_CHECK(!rows.empty(), "make_batch: no rows");
  int64_t T = 0;
  for (const Example* r : rows) T = std::max<int64_t>(T, r->tokens.size());
  const int64_t B = static_cast<int64_t>(rows.size());
  Batch b;
  b.input_ids = at::zeros({B, T}, at::kLong);
  b.labels = at::full({B, T}, kIgnoreIndex, at::kLong);
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto lab = b.labels.accessor<int64_t, 2>();
  for (int64_t i = 0; i < B; ++i) {
    const Example& e = *rows[i];
    for (size_t j = 0; j < e.tokens.size(); ++j) {
      ids[i][j] = e.tokens[j];
      const bool trained = e.loss_mask.empty() ? static_cast<int64_t>(j) >= e.prompt_len : e.loss_mask[j] != 0;
      if (trained) lab[i][j] = e.tokens[j];
    }
    b.n_tokens += static_cast<int64_t>(e.tokens.size());
  }
  return b;
}

namespace {
std::vector<int64_t> example_lengths(const Dataset& data) {
  std::vector<int64_t> n;
  for (const Example& e : data.examples) n.push_back(static_cast<int64_t>(e.tokens.size()));
  return n;
}
}  // namespace

Batcher::Batcher(const Dataset& data, int64_t batch_size, uint64_t seed, bool shuffle, bool keep_tail)
    : Batcher(example_lengths(data), batch_size, seed, shuffle, keep_tail) {
  data_ = &data;
}

Batcher::Batcher(const std::vector<int64_t>& lengths, int64_t batch_size, uint64_t seed, bool shuffle, bool keep_tail)
    : seed_(seed), shuffle_(shuffle) {
  const int64_t n = static_cast<int64_t>(lengths.size());
  HEARTH_CHECK(batch_size >= 1, "batch size must be >= 1, got ", batch_size);
  HEARTH_CHECK(n >= (keep_tail ? 1 : batch_size), "dataset has ", n, " examples, fewer than the batch size ", batch_size);
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return lengths[a] < lengths[b]; });
  for (int64_t i = 0; i + batch_size <= n; i += batch_size)
    windows_.emplace_back(idx.begin() + i, idx.begin() + i + batch_size);
  if (keep_tail && n % batch_size != 0) windows_.emplace_back(idx.begin() + n - n % batch_size, idx.end());
  reorder();
}

void Batcher::reorder() {
  order_.resize(windows_.size());
  std::iota(order_.begin(), order_.end(), 0);
  if (!shuffle_) return;
  std::mt19937_64 rng(seed_ + static_cast<uint64_t>(epoch_));
  for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng() % i]);  // Fisher-Yates
}

void Batcher::seek(int64_t epoch, int64_t index) {
  HEARTH_CHECK(epoch >= 0 && index >= 0 && index <= num_batches(), "data position (", epoch, ", ", index,
               ") is outside the dataset's ", num_batches(), " batches");
  epoch_ = epoch;
  index_ = index;
  reorder();
}

std::vector<int64_t> Batcher::next_indices() {
  if (index_ >= num_batches()) {
    ++epoch_;
    index_ = 0;
    reorder();
  }
  return windows_[order_[index_++]];
}

Batch Batcher::next() {
  HEARTH_CHECK(data_ != nullptr, "Batcher::next: this batcher was made from lengths; use next_indices()");
  std::vector<const Example*> rows;
  for (int64_t i : next_indices()) rows.push_back(&data_->examples[i]);
  return make_batch(rows);
}

}  // namespace hearth::train
