// Preference rows → (chosen, rejected) token pairs and their batches (preference_data.h).
#include "train/preference_data.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <optional>

#include "chat/chat_template.h"
#include "core/error.h"
#include "core/json_nesting.h"
#include "train/dataset.h"
#include "train/loss.h"

namespace hearth::train {

namespace {

using ojson = nlohmann::ordered_json;


bool starts_with(const std::vector<int32_t>& v, const std::vector<int32_t>& prefix) {
  return prefix.size() <= v.size() && std::equal(prefix.begin(), prefix.end(), v.begin());
}

// Field errors: "\"<field>\": <problem>" (the caller adds "<file>:<line>: ").
[[noreturn]] void field_error(const char* field, const std::string& problem) {
  throw Error(cat("\"", field, "\": ", problem));
}

// What one row's prompt is: raw text, or messages for the chat template.
struct Prompt {
  bool chat = false;
  std::string text;         // the raw text, or the rendered messages with the generation prompt
  ojson messages, tools;    // chat only
  std::vector<int32_t> ids;
};

struct Tokenize {
  const tokenizer::Tokenizer& tok;
  std::optional<chat::ChatTemplate> tmpl;

  const chat::ChatTemplate& templ() {
    if (!tmpl) tmpl.emplace(tok.chat_template());
    return *tmpl;
  }

  std::string render(const ojson& messages, const ojson& tools, bool gen_prompt) {
    chat::ChatInputs in;
    in.messages = messages;
    in.tools = tools;
    in.add_generation_prompt = gen_prompt;
    in.extra_kwargs = ojson{{"enable_thinking", false}};
    in.bos_token = tok.bos_token();
    in.eos_token = tok.eos_token();
    in.null_content_as_empty = true;
    return templ().render(in);
  }

  Prompt prompt(const ojson& row) {
    Prompt p;
    const char* key = row.contains("prompt") ? "prompt" : "messages";
    auto it = row.find(key);
    if (it == row.end())
      throw Error("missing key \"prompt\" (text or a messages array; --method dpo/orpo rows are {\"prompt\", "
                  "\"chosen\", \"rejected\"})");
    if (it->is_string()) {
      p.text = it->get<std::string>();
      p.ids = tok.encode(p.text, true);
      return p;
    }
    if (!it->is_array() || it->empty()) field_error(key, "must be a string or a non-empty messages array");
    for (size_t i = 0; i < it->size(); ++i) {
      const ojson& m = (*it)[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        field_error(key, cat("message ", i, " must be an object with a string \"role\""));
    }
    if (tok.chat_template().empty()) field_error(key, "is a messages array, but the tokenizer has no chat template");
    p.chat = true;
    p.messages = *it;
    p.tools = row.contains("tools") ? row["tools"] : ojson();
    p.text = render(p.messages, p.tools, true);
    p.ids = tok.encode(p.text, false);
    return p;
  }

  // One response sequence of `row[field]` after prompt `p`.
  Example response(const ojson& row, const char* field, const Prompt& p) {
    auto it = row.find(field);
    if (it == row.end())
      throw Error(cat("missing key \"", field, "\" (--method dpo/orpo rows are {\"prompt\", \"chosen\", \"rejected\"})"));
    const ojson* msg = nullptr;
    if (it->is_object()) msg = &*it;
    else if (it->is_array() && it->size() == 1 && (*it)[0].is_object()) msg = &(*it)[0];
    else if (!it->is_string())
      field_error(field, "must be a string, an assistant message or a one-message array");
    Example ex;
    if (msg) {
      if (!msg->contains("role") || (*msg)["role"] != "assistant")
        field_error(field, "a message response must have \"role\": \"assistant\"");
      if (!p.chat)
        field_error(field, "is a message, but \"prompt\" is text: give the prompt as messages, or the response as text");
      ojson all = p.messages;
      all.push_back(*msg);
      ex.tokens = tok.encode(render(all, p.tools, false), false);
      ex.prompt_len = common_prefix(p.ids, ex.tokens);
    } else {
      const std::string& r = it->get_ref<const std::string&>();
      ex.tokens = tok.encode(p.text + r, !p.chat);
      if (!starts_with(ex.tokens, p.ids)) {
        ex.tokens = p.ids;
        const auto rest = tok.encode(r, false);
        ex.tokens.insert(ex.tokens.end(), rest.begin(), rest.end());
      }
      ex.prompt_len = static_cast<int64_t>(p.ids.size());
      if (auto eos = tok.eos_id(); eos && (ex.tokens.empty() || ex.tokens.back() != *eos)) ex.tokens.push_back(*eos);
    }
    if (auto bos = tok.bos_id(); bos && ex.tokens.size() >= 2 && ex.tokens[0] == *bos && ex.tokens[1] == *bos) {
      ex.tokens.erase(ex.tokens.begin());  // template text + tokenizer both added BOS
      ex.prompt_len = std::max<int64_t>(0, ex.prompt_len - 1);
    }
    if (static_cast<int64_t>(ex.tokens.size()) <= ex.prompt_len || ex.tokens.size() < 2)
      field_error(field, "the response adds no token after the prompt: nothing to score");
    return ex;
  }
};

// mlx-bun's left truncation; returns true when the whole prompt was dropped.
bool truncate_left(Example& ex, int64_t max_len) {
  const int64_t n = static_cast<int64_t>(ex.tokens.size());
  if (n <= max_len) return false;
  const int64_t excess = n - max_len;
  if (excess < ex.prompt_len) {
    ex.tokens.erase(ex.tokens.begin(), ex.tokens.begin() + excess);
    ex.prompt_len -= excess;
    return false;
  }
  ex.tokens.erase(ex.tokens.begin(), ex.tokens.end() - max_len);
  ex.prompt_len = 0;
  return true;
}

}  // namespace

std::vector<int64_t> PreferenceDataset::lengths() const {
  std::vector<int64_t> n;
  for (const auto& p : pairs)
    n.push_back(static_cast<int64_t>(std::max(p.chosen.tokens.size(), p.rejected.tokens.size())));
  return n;
}

PreferenceDataset load_preference_jsonl(const std::filesystem::path& path, const tokenizer::Tokenizer& tok,
                                        int64_t max_seq_length) {
  HEARTH_CHECK(max_seq_length >= 2, "data: max_seq_length must be >= 2, got ", max_seq_length);
  std::ifstream in(path);
  HEARTH_CHECK(in, path.string(), ": cannot open");
  const std::string name = path.filename().string();
  PreferenceDataset ds;
  Tokenize tz{tok, std::nullopt};
  bool any = false;
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    any = true;
    try {
      if (auto deep = json_nesting_violation(line)) throw Error(json_nesting_message("row", *deep));
      ojson row;
      try {
        row = ojson::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw Error(cat("not valid JSON (", e.what(), ")"));
      }
      if (!row.is_object()) throw Error("row must be a JSON object with \"prompt\", \"chosen\" and \"rejected\"");
      const Prompt p = tz.prompt(row);
      PreferencePair pair{tz.response(row, "chosen", p), tz.response(row, "rejected", p)};
      const bool dropped_c = truncate_left(pair.chosen, max_seq_length);
      const bool dropped_r = truncate_left(pair.rejected, max_seq_length);
      if (dropped_c || dropped_r) ++ds.prompt_dropped;
      ds.pairs.push_back(std::move(pair));
    } catch (const Error& e) {
      throw Error(cat(name, ":", lineno, ": ", e.what()));
    }
  }
  HEARTH_CHECK(any, path.string(), ": no rows");
  return ds;
}

PreferenceBatch make_preference_batch(const PreferenceDataset& data, const std::vector<int64_t>& indices) {
  HEARTH_CHECK(!indices.empty(), "make_preference_batch: no pairs");
  const int64_t B = static_cast<int64_t>(indices.size());
  std::vector<const Example*> rows(2 * B);
  for (int64_t i = 0; i < B; ++i) {
    HEARTH_CHECK(indices[i] >= 0 && indices[i] < static_cast<int64_t>(data.pairs.size()),
                 "make_preference_batch: pair ", indices[i], " out of range");
    rows[i] = &data.pairs[indices[i]].chosen;
    rows[B + i] = &data.pairs[indices[i]].rejected;
  }
  Batch b = make_batch(rows);
  PreferenceBatch out;
  out.input_ids = b.input_ids;
  out.labels = b.labels;
  out.full_labels = at::full_like(b.labels, kIgnoreIndex);
  for (int64_t i = 0; i < 2 * B; ++i) {
    const int64_t n = static_cast<int64_t>(rows[i]->tokens.size());
    out.full_labels[i].narrow(0, 0, n).copy_(b.input_ids[i].narrow(0, 0, n));
  }
  out.pairs = B;
  return out;
}

}  // namespace hearth::train
