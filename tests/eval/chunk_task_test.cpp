// The chunking task's scorer on hand-made cases (exact, partial, duplicates, trimming, invalid JSON,
// empty) and its jsonl reader (both row formats, one-line errors naming file:line).
#include "eval/chunk_task.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace fs = std::filesystem;
using hearth::eval::load_chunk_examples;
using hearth::eval::parse_sentence_array;
using hearth::eval::score_chunk_output;
using hearth::eval::sentence_f1;

TEST(ChunkScore, ExactMatchIsOne) {
  auto s = score_chunk_output(R"(["A cat sat.", "It purred."])", {"A cat sat.", "It purred."});
  EXPECT_TRUE(s.valid_json);
  EXPECT_DOUBLE_EQ(s.f1, 1.0);
  // Order does not matter; surrounding whitespace of the output and of each sentence is ignored.
  s = score_chunk_output(" \n[\" It purred. \", \"A cat sat.\"]\n", {"A cat sat.", "It purred."});
  EXPECT_TRUE(s.valid_json);
  EXPECT_DOUBLE_EQ(s.f1, 1.0);
}

TEST(ChunkScore, PartialMatches) {
  // 2 of 3 reference sentences, nothing wrong predicted: P = 1, R = 2/3, F1 = 0.8.
  EXPECT_DOUBLE_EQ(sentence_f1({"A.", "B."}, {"A.", "B.", "C."}), 0.8);
  // One right, one merged wrong: matches 1, |pred| 2, |ref| 3 → 2/5.
  EXPECT_DOUBLE_EQ(sentence_f1({"A.", "B. C."}, {"A.", "B.", "C."}), 0.4);
  // Unsplit paragraph: no sentence matches.
  EXPECT_DOUBLE_EQ(sentence_f1({"A. B."}, {"A.", "B."}), 0.0);
  // Case and inner spacing must match exactly.
  EXPECT_DOUBLE_EQ(sentence_f1({"a.", "B.  "}, {"A.", "B."}), 2.0 * 1 / 4);
}

TEST(ChunkScore, DuplicatesCountAsMultiset) {
  // A sentence predicted twice but present once matches once: 2·2/(3+2).
  EXPECT_DOUBLE_EQ(sentence_f1({"A.", "A.", "B."}, {"A.", "B."}), 0.8);
  // A sentence present twice in the reference and predicted once: 2·1/(1+2).
  EXPECT_DOUBLE_EQ(sentence_f1({"Yes."}, {"Yes.", "Yes."}), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(sentence_f1({"Yes.", "Yes."}, {"Yes.", "Yes."}), 1.0);
}

TEST(ChunkScore, InvalidJsonScoresZero) {
  for (const char* bad : {"", "not json", "[\"a\", 1]", "{\"a\": \"b\"}", "[\"a\", \"b", "\"a\"", "[\"a\"] trailing",
                          "[[\"a\"]]"}) {
    auto s = score_chunk_output(bad, {"a"});
    EXPECT_FALSE(s.valid_json) << bad;
    EXPECT_EQ(s.f1, 0.0) << bad;
  }
  EXPECT_FALSE(parse_sentence_array("[null]").has_value());
}

TEST(ChunkScore, EmptyArrays) {
  auto s = score_chunk_output("[]", {"A."});
  EXPECT_TRUE(s.valid_json);
  EXPECT_EQ(s.f1, 0.0);
  EXPECT_EQ(sentence_f1({}, {}), 1.0);
  EXPECT_EQ(sentence_f1({"A."}, {}), 0.0);
}

TEST(ChunkScore, JsonEscapesAreDecoded) {
  // The reference holds the decoded text; the output's JSON escapes must decode to it.
  auto s = score_chunk_output(R"(["He said, \"No.\"", "Caf\u00e9."])", {"He said, \"No.\"", "Caf\xc3\xa9."});
  EXPECT_TRUE(s.valid_json);
  EXPECT_DOUBLE_EQ(s.f1, 1.0);
}

namespace {
fs::path write_temp(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / ("hearth_chunk_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}
}  // namespace

TEST(ChunkData, ReadsBothRowFormats) {
  fs::path p = write_temp("ok.jsonl",
                          R"({"prompt": "Split: A. B.", "completion": "[\"A.\", \"B.\"]"})"
                          "\n\n"
                          R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "Split: C."}, {"role": "assistant", "content": "[\"C.\"]"}]})"
                          "\n");
  auto ex = load_chunk_examples(p);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].prompt, "Split: A. B.");
  EXPECT_EQ(ex[0].reference, (std::vector<std::string>{"A.", "B."}));
  EXPECT_EQ(ex[1].prompt, "Split: C.");
  EXPECT_EQ(ex[1].reference, (std::vector<std::string>{"C."}));
  EXPECT_EQ(load_chunk_examples(p, 1).size(), 1u);
  fs::remove(p);
}

TEST(ChunkData, BadRowsNameFileAndLine) {
  fs::path p = write_temp("bad.jsonl", "{\"prompt\": \"x\", \"completion\": \"[\\\"a\\\"]\"}\n"
                                       "{\"prompt\": \"x\", \"completion\": \"not an array\"}\n");
  try {
    load_chunk_examples(p);
    FAIL() << "expected an error";
  } catch (const hearth::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p.filename().string() + ":2: the completion is not a JSON array of strings"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  fs::path q = write_temp("bad2.jsonl", "{\"text\": \"x\"}\n");
  EXPECT_THROW(load_chunk_examples(q), hearth::Error);
  // Messages of the wrong JSON types: our line with file and line, not a library type_error.
  for (const char* row : {R"({"messages":["hi",{"role":"assistant","content":"[]"}]})",
                          R"({"messages":[{"role":5,"content":"x"},{"role":"assistant","content":"[\"a\"]"}]})",
                          R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":7}]})"}) {
    fs::path m = write_temp("bad3.jsonl", std::string(row) + "\n");
    try {
      load_chunk_examples(m);
      ADD_FAILURE() << "expected an error for " << row;
    } catch (const hearth::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("bad3.jsonl:1: "), std::string::npos) << msg;
      EXPECT_EQ(msg.find("json.exception"), std::string::npos) << msg;
    }
    fs::remove(m);
  }
  fs::path empty = write_temp("empty.jsonl", "\n");
  EXPECT_THROW(load_chunk_examples(empty), hearth::Error);
  EXPECT_THROW(load_chunk_examples("/nonexistent/x.jsonl"), hearth::NotFound);
  fs::remove(p), fs::remove(q), fs::remove(empty);
}
