// jsonl data: each format's tokens and prompt masks on the tiny tokenizer, malformed rows with
// file:line errors, text packing, padding and labels, and the batcher's seeded order.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "tokenizer/tokenizer.h"
#include "train/dataset.h"
#include "train/loss.h"
#include "test_paths.h"

using namespace hearth::train;
namespace fs = std::filesystem;

namespace {

const fs::path kTiny = fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/llama_mha";

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) : path(fs::temp_directory_path() / ("hearth_ds_" + name)) {
    hearth::io::remove_tree(path);
    fs::create_directories(path);
  }
  ~TempDir() { hearth::io::remove_tree(path); }
  fs::path write(const std::string& file, const std::string& text) const {
    hearth::io::write_file_atomic(path / file, text);
    return path / file;
  }
};

hearth::tokenizer::Tokenizer tiny() { return hearth::tokenizer::Tokenizer::from_dir(kTiny); }

// The tiny tokenizer with a chat template (the golden tiny model has none): by default a minimal one.
hearth::tokenizer::Tokenizer tiny_chat(const TempDir& d,
                                       const std::string& chat_template =
                                           "{% for m in messages %}<|bos|>{{ m.role }}:\n{{ m.content }}\n{% endfor %}"
                                           "{% if add_generation_prompt %}<|bos|>assistant:\n{% endif %}") {
  fs::copy_file(kTiny / "tokenizer.json", d.path / "tokenizer.json", fs::copy_options::overwrite_existing);
  d.write("tokenizer_config.json",
          nlohmann::json{{"bos_token", "<|bos|>"}, {"eos_token", "<|endoftext|>"}, {"chat_template", chat_template}}.dump());
  return hearth::tokenizer::Tokenizer::from_dir(d.path);
}

std::string decode_from(const hearth::tokenizer::Tokenizer& tok, const Example& e, int64_t from) {
  return tok.decode(std::vector<int32_t>(e.tokens.begin() + from, e.tokens.end()), false);
}

}  // namespace

TEST(Dataset, TextRowsLossOnAllTokensWithEos) {
  TempDir d("text");
  auto tok = tiny();
  Dataset ds = load_jsonl(d.write("train.jsonl", "{\"text\": \"hello world\"}\n\n{\"text\": \"the cat\"}\n"), tok, {});
  EXPECT_EQ(ds.format, DataFormat::kText);
  ASSERT_EQ(ds.examples.size(), 2u);
  std::vector<int32_t> want = tok.encode("hello world", true);
  want.push_back(*tok.eos_id());
  EXPECT_EQ(ds.examples[0].tokens, want);
  EXPECT_EQ(ds.examples[0].prompt_len, 0);
  EXPECT_EQ(decode_from(tok, ds.examples[1], 0), "<|bos|>the cat<|endoftext|>");
}

TEST(Dataset, CompletionWithoutTemplateMasksThePrompt) {
  TempDir d("completion");
  auto tok = tiny();
  Dataset ds = load_jsonl(d.write("train.jsonl", "{\"prompt\": \"Question: one\", \"completion\": \" two\"}\n"), tok, {});
  EXPECT_EQ(ds.format, DataFormat::kCompletion);
  const Example& e = ds.examples.at(0);
  EXPECT_EQ(e.prompt_len, static_cast<int64_t>(tok.encode("Question: one", true).size()));
  EXPECT_EQ(decode_from(tok, e, e.prompt_len), " two<|endoftext|>");
}

TEST(Dataset, ChatLossOnLastAssistantTurn) {
  TempDir d("chat");
  auto tok = tiny_chat(d);
  Dataset ds = load_jsonl(d.write("train.jsonl",
                                  R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}, {"role": "assistant", "content": "done"}]})"
                                  "\n"),
                          tok, {});
  EXPECT_EQ(ds.format, DataFormat::kChat);
  const Example& e = ds.examples.at(0);
  EXPECT_EQ(decode_from(tok, e, 0), "<|bos|>user:\nhi\n<|bos|>assistant:\nyo\n<|bos|>user:\nmore\n<|bos|>assistant:\ndone\n");
  EXPECT_EQ(decode_from(tok, e, e.prompt_len), "done\n");
  // Turns after the last assistant message are not part of the row (they were trained on).
  Dataset trailing = load_jsonl(d.write("trailing.jsonl",
                                        R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "zebra zebra"}, {"role": "tool", "content": "x"}]})"
                                        "\n"),
                                tok, {});
  const Example& t = trailing.examples.at(0);
  EXPECT_EQ(decode_from(tok, t, 0), "<|bos|>user:\nhi\n<|bos|>assistant:\nyo\n");
  EXPECT_EQ(decode_from(tok, t, t.prompt_len), "yo\n");
}

TEST(Dataset, CompletionWithTemplateIsAUserAssistantChat) {
  TempDir d("completion_chat");
  auto tok = tiny_chat(d);
  Dataset ds = load_jsonl(d.write("train.jsonl", R"({"prompt": "2+2", "completion": "4"})" "\n"), tok, {});
  const Example& e = ds.examples.at(0);
  EXPECT_EQ(decode_from(tok, e, 0), "<|bos|>user:\n2+2\n<|bos|>assistant:\n4\n");
  EXPECT_EQ(decode_from(tok, e, e.prompt_len), "4\n");
}

TEST(Dataset, MalformedRowsNameFileAndLine) {
  TempDir d("bad");
  auto tok = tiny();
  auto expect_error = [&](const std::string& body, const std::string& want) {
    try {
      load_jsonl(d.write("train.jsonl", body), tok, {});
      ADD_FAILURE() << "no error for " << body;
    } catch (const hearth::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error("{\"text\": \"a b c\"}\n{\"text\": \"x\"\n", "train.jsonl:2: not valid JSON");
  expect_error("{\"prompt\": \"a b\", \"completion\": \"c d\"}\n{\"prompt\": \"a\"}\n",
               "train.jsonl:2: missing key \"completion\"");
  expect_error("{\"text\": 5}\n", "train.jsonl:1: \"text\" must be a string");
  expect_error("[1, 2]\n", "train.jsonl:1: row must be a JSON object");
  expect_error("{\"foo\": 1}\n", "train.jsonl:1: no \"prompt\"+\"completion\", \"messages\" or \"text\" key");
  expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n", "train.jsonl:1: \"messages\" has no assistant");
  expect_error("\n\n", "no rows");
}

TEST(Dataset, TruncatesAndPacks) {
  TempDir d("pack");
  auto tok = tiny();
  const std::string body = "{\"text\": \"one two three four five six seven\"}\n{\"text\": \"eight nine ten\"}\n";
  DataOptions o;
  o.max_seq_length = 4;
  Dataset cut = load_jsonl(d.write("train.jsonl", body), tok, o);
  ASSERT_EQ(cut.examples.size(), 2u);
  for (const auto& e : cut.examples) EXPECT_LE(e.tokens.size(), 4u);
  o.pack_text = true;
  Dataset packed = load_jsonl(d.path / "train.jsonl", tok, o);
  std::vector<int32_t> stream, joined;
  for (const char* t : {"one two three four five six seven", "eight nine ten"}) {
    auto ids = tok.encode(t, true);
    ids.push_back(*tok.eos_id());
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  for (const auto& e : packed.examples) {
    EXPECT_LE(e.tokens.size(), 4u);
    joined.insert(joined.end(), e.tokens.begin(), e.tokens.end());
  }
  // Every full piece is 4 tokens; a last piece of one token is dropped (nothing to predict).
  stream.resize(joined.size());
  EXPECT_EQ(joined, stream);
  EXPECT_GE(packed.examples.size(), 3u);
}

TEST(Dataset, BatchPadsRightAndMasksPromptAndPadding) {
  Example a{{5, 6, 7, 8, 9}, 2}, b{{11, 12, 13}, 0};
  Batch batch = make_batch({&a, &b});
  ASSERT_EQ(batch.input_ids.sizes(), (std::vector<int64_t>{2, 5}));
  const int64_t ids[] = {5, 6, 7, 8, 9, 11, 12, 13, 0, 0};
  const int64_t lab[] = {-100, -100, 7, 8, 9, 11, 12, 13, -100, -100};
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(batch.input_ids.view(-1)[i].item<int64_t>(), ids[i]) << i;
    EXPECT_EQ(batch.labels.view(-1)[i].item<int64_t>(), lab[i]) << i;
  }
  EXPECT_EQ(batch.n_tokens, 8);
  // next-token targets: the supervised positions are 1..3 of row 0 and 0..1 of row 1
  EXPECT_EQ(shift_labels(batch.labels).ne(kIgnoreIndex).sum().item<int64_t>(), 5);
}

TEST(Dataset, BatcherShufflesWindowsBySeedAndSeeks) {
  Dataset ds;
  for (int i = 0; i < 10; ++i) ds.examples.push_back(Example{std::vector<int32_t>(2 + (i * 7) % 10, i), 0});
  Batcher b1(ds, 3, 42), b2(ds, 3, 42), b3(ds, 3, 7);
  EXPECT_EQ(b1.num_batches(), 3);  // 10 examples, tail of 1 dropped
  std::set<int64_t> first_tokens;
  std::vector<int64_t> seq1, seq3;
  for (int i = 0; i < 9; ++i) {
    Batch x = b1.next(), y = b2.next(), z = b3.next();
    EXPECT_TRUE(x.input_ids.equal(y.input_ids));
    seq1.push_back(x.input_ids[0][0].item<int64_t>());
    seq3.push_back(z.input_ids[0][0].item<int64_t>());
    if (i < 3) first_tokens.insert(x.input_ids[0][0].item<int64_t>());
    // windows are length-sorted neighbours: all rows of a batch come from one window of 3
    EXPECT_EQ(x.input_ids.size(0), 3);
  }
  EXPECT_EQ(first_tokens.size(), 3u);  // one epoch visits every window once
  EXPECT_NE(seq1, seq3);               // another seed, another order
  Batcher b4(ds, 3, 42);
  b4.seek(1, 2);  // epoch 1, batch 2 == the 6th batch drawn
  EXPECT_EQ(b4.next().input_ids[0][0].item<int64_t>(), seq1[5]);
  EXPECT_THROW(b4.seek(0, 4), hearth::Error);
  EXPECT_THROW(Batcher(ds, 11, 0), hearth::Error);
}

// A template that gives the answer no token is named as the cause (it blamed --max-seq-length).
TEST(Dataset, ATemplateWithEmptyGenerationBlocksIsNamed) {
  TempDir d("empty_generation");
  auto tok = tiny_chat(d, "{% for m in messages %}<|bos|>{{ m.role }}: {{ m.content }}\n{% endfor %}{% generation %}{% endgeneration %}");
  try {
    load_jsonl(d.write("train.jsonl", R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "xyz"}]})"
                                      "\n"),
               tok, {});
    ADD_FAILURE() << "loaded";
  } catch (const hearth::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "train.jsonl:1: the chat template's {% generation %} blocks hold no token of this row (no token to train on)");
  }
}

TEST(Dataset, GenerationBlocksAreExactlyTheLossMask) {
  TempDir d("generation");
  auto tok = tiny_chat(d, "{% for m in messages %}<|bos|>{{ m.role }}:\n{% if m.role == 'assistant' %}{% generation %}"
                          "{{ m.content }}<|endoftext|>{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}");
  Dataset ds = load_jsonl(d.write("train.jsonl",
                                  R"({"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "the cat"}, {"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]})"
                                  "\n"),
                          tok, {});
  const Example& e = ds.examples.at(0);
  ASSERT_EQ(e.loss_mask.size(), e.tokens.size());
  EXPECT_EQ(decode_from(tok, e, 0),
            "<|bos|>user:\nhello<|bos|>assistant:\nthe cat<|endoftext|><|bos|>user:\none<|bos|>assistant:\ntwo<|endoftext|>");
  // (trim_blocks eats the newline after {% endif %}.)
  // Both assistant turns (not only the last), and nothing else: two runs of masked tokens.
  std::vector<std::string> runs;
  for (size_t j = 0; j < e.tokens.size(); ++j) {
    if (!e.loss_mask[j]) continue;
    if (j == 0 || !e.loss_mask[j - 1]) runs.emplace_back();
    runs.back() += tok.decode({e.tokens[j]}, false);
  }
  EXPECT_EQ(runs, (std::vector<std::string>{"the cat<|endoftext|>", "two<|endoftext|>"}));
  // The batch's labels follow the mask.
  Batch b = make_batch({&e});
  for (size_t j = 0; j < e.tokens.size(); ++j)
    EXPECT_EQ(b.labels[0][static_cast<int64_t>(j)].item<int64_t>(), e.loss_mask[j] ? e.tokens[j] : kIgnoreIndex) << j;
  // Truncation keeps tokens and mask aligned (cut two tokens into the first block).
  size_t first = 0;
  while (!e.loss_mask[first]) ++first;
  DataOptions o;
  o.max_seq_length = static_cast<int64_t>(first) + 2;
  Dataset cut = load_jsonl(d.path / "train.jsonl", tok, o);
  EXPECT_EQ(cut.examples.at(0).tokens.size(), first + 2);
  EXPECT_EQ(cut.examples.at(0).loss_mask.size(), first + 2);
  // Cut before the first block: no target left, the row is skipped (and a file of only such rows
  // is an error naming it).
  o.max_seq_length = static_cast<int64_t>(first);
  EXPECT_THROW(load_jsonl(d.path / "train.jsonl", tok, o), hearth::Error);
}

TEST(Dataset, DeeplyNestedRowIsAOneLineError) {
  TempDir d("deep");
  auto tok = tiny_chat(d);
  const std::string deep = std::string(15000, '[') + std::string(15000, ']');
  try {
    load_jsonl(d.write("train.jsonl", R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": )" + deep + "}}]}\n"),
               tok, {});
    ADD_FAILURE() << "accepted";
  } catch (const hearth::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "train.jsonl:1: row: tools[0].function.parameters[0][0][0][0]…: JSON nested deeper than 128 levels");
  }
}

TEST(Dataset, ToolCallTurnsWithNullContentRender) {
  TempDir d("nullcontent");
  fs::copy_file(kTiny / "tokenizer.json", d.path / "tokenizer.json", fs::copy_options::overwrite_existing);
  // Like real templates: the content is concatenated, which fails on None.
  d.write("tokenizer_config.json", R"({"bos_token": "<|bos|>", "eos_token": "<|endoftext|>", "chat_template":
    "{% for m in messages %}{{ m.role + ':' + m.content }}\n{% endfor %}"})");
  auto tok = hearth::tokenizer::Tokenizer::from_dir(d.path);
  Dataset ds = load_jsonl(d.write("train.jsonl",
                                  R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}, {"role": "tool", "content": "1"}, {"role": "assistant", "content": "ok"}]})"
                                  "\n"),
                          tok, {});
  EXPECT_EQ(decode_from(tok, ds.examples.at(0), 0), "user:hi\nassistant:\ntool:1\nassistant:ok\n");
}

// Issue 16 item 23: a row whose prompt alone fills max_seq_length has no target token once cut;
// it used to be trained on its last prompt token. Skipped and counted; all such rows: an error.
TEST(Dataset, RowsWhosePromptFillsTheLengthAreSkipped) {
  TempDir d("prompt_fills");
  auto tok = tiny();
  const std::string long_prompt = "one two three four five six seven eight nine ten";
  ASSERT_GT(tok.encode(long_prompt, true).size(), 6u);
  const std::string body = "{\"prompt\": \"" + long_prompt + "\", \"completion\": \" yes\"}\n"
                           "{\"prompt\": \"a\", \"completion\": \" b\"}\n"
                           "{\"prompt\": \"" + long_prompt + " again\", \"completion\": \" no\"}\n";
  DataOptions o;
  o.max_seq_length = 6;
  Dataset ds = load_jsonl(d.write("train.jsonl", body), tok, o);
  EXPECT_EQ(ds.skipped_no_target, 2);
  ASSERT_EQ(ds.examples.size(), 1u);
  EXPECT_EQ(decode_from(tok, ds.examples[0], ds.examples[0].prompt_len), " b<|endoftext|>");
  // every example left has a target in its kept tokens
  Batch b = make_batch({&ds.examples[0]});
  EXPECT_GT(shift_labels(b.labels).ne(kIgnoreIndex).sum().item<int64_t>(), 0);
  // a file of only such rows: one clear error naming it, not a run that trains on prompts
  const std::string only = "{\"prompt\": \"" + long_prompt + "\", \"completion\": \" yes\"}\n";
  try {
    load_jsonl(d.write("valid.jsonl", only), tok, o);
    ADD_FAILURE() << "no error";
  } catch (const hearth::Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid.jsonl: no row has a token to train on"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--max-seq-length) 6"), std::string::npos) << e.what();
  }
  // a prompt one token shorter than the limit keeps exactly one target
  const int64_t plen = static_cast<int64_t>(tok.encode("a", true).size());
  o.max_seq_length = plen + 1;
  Dataset one = load_jsonl(d.write("t2.jsonl", "{\"prompt\": \"a\", \"completion\": \" b c d\"}\n"), tok, o);
  ASSERT_EQ(one.examples.size(), 1u);
  EXPECT_EQ(one.skipped_no_target, 0);
  EXPECT_EQ(static_cast<int64_t>(one.examples[0].tokens.size()) - one.examples[0].prompt_len, 1);
}
