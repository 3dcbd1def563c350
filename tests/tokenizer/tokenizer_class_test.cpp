// tokenizer_config.json applied as transformers 5 applies it: the LlamaTokenizer class rebuilds the
// pipeline (Metaspace with prepend_scheme from legacy / add_prefix_space instead of tokenizer.json's
// Prepend normalizer), and an eos_token missing from the vocabulary is refused. The golden test
// covers real files (tests/golden/tokenizer/llama2*.json, made with AutoTokenizer).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

using hearth::tokenizer::Tokenizer;

namespace {

// SentencePiece-style legacy tokenizer.json (Prepend "▁" + Replace " " → "▁" normalizer), as the
// Llama-2 conversions ship. vocab: a=0 b=1 ab=2 ▁=3 ▁ab=4 <unk>=5; <s>=6 and </s>=7 added.
std::string legacy_json() {
  return R"({"version":"1.0","added_tokens":[{"id":6,"content":"<s>","special":true,"normalized":false},
    {"id":7,"content":"</s>","special":true,"normalized":false}],
    "normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"\u2581"},
      {"type":"Replace","pattern":{"String":" "},"content":"\u2581"}]},
    "decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"\u2581"},"content":" "},
      {"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]},
    "model":{"type":"BPE","unk_token":"<unk>","fuse_unk":true,"byte_fallback":false,
      "vocab":{"a":0,"b":1,"ab":2,"\u2581":3,"\u2581ab":4,"<unk>":5},"merges":["a b","\u2581 ab"]}})";
}

Tokenizer with_config(const std::string& config) {
  return Tokenizer::from_json_text(legacy_json(), "tokenizer.json", config, "tokenizer_config.json");
}

using Ids = std::vector<int32_t>;

}  // namespace

TEST(TokenizerClass, OtherClassesUseTokenizerJsonVerbatim) {
  Tokenizer t = with_config(R"({"tokenizer_class":"PreTrainedTokenizerFast","eos_token":"</s>"})");
  EXPECT_EQ(t.encode(" ab", false), (Ids{3, 4}));  // "▁" prepended even before a space: "▁▁ab"
  EXPECT_EQ(t.encode("ab", true), (Ids{4}));       // no post-processor, add_bos_token absent
}

// transformers 5 (models/llama/tokenization_llama.py): Metaspace(prepend_scheme "always" for
// legacy, "first" otherwise, "never" without add_prefix_space), add_bos_token defaulting to true.
TEST(TokenizerClass, LlamaTokenizerIsRebuiltLikeTransformers5) {
  Tokenizer legacy = with_config(R"({"tokenizer_class":"LlamaTokenizer","legacy":true,"bos_token":"<s>","eos_token":"</s>"})");
  EXPECT_EQ(legacy.encode(" ab", false), (Ids{4}));        // " ab" already starts with "▁": no second one
  EXPECT_EQ(legacy.encode("ab", false), (Ids{4}));
  EXPECT_EQ(legacy.encode("ab", true), (Ids{6, 4}));       // BOS by default
  EXPECT_EQ(legacy.encode("<s>ab", false), (Ids{6, 4}));   // "always": also after a special token
  EXPECT_EQ(legacy.decode({6, 4}, true), "ab");
  Tokenizer first = with_config(R"({"tokenizer_class":"LlamaTokenizerFast","bos_token":"<s>","eos_token":"</s>"})");
  EXPECT_EQ(first.encode("ab", false), (Ids{4}));
  EXPECT_EQ(first.encode("<s>ab", false), (Ids{6, 2}));    // "first" (legacy defaults to false)
  Tokenizer never = with_config(R"({"tokenizer_class":"LlamaTokenizer","add_prefix_space":false,"add_bos_token":false})");
  EXPECT_EQ(never.encode("ab", true), (Ids{2}));
  EXPECT_EQ(never.decode({4}, false), " ab");              // no Strip decoder without add_prefix_space
  // A wrong-typed setting names the file and field.
  try {
    with_config(R"({"tokenizer_class":"LlamaTokenizer","legacy":"yes"})");
    FAIL();
  } catch (const hearth::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: legacy: expected true or false"), std::string::npos)
        << e.what();
  }
}

// An eos_token the vocabulary lacks can never be generated: generation would never stop on it.
TEST(TokenizerClass, EosTokenMissingFromVocabIsRefused) {
  try {
    with_config(R"({"eos_token":"<|im_end|>"})");
    FAIL();
  } catch (const hearth::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tokenizer_config.json: eos_token: token '<|im_end|>' is not in the vocabulary (tokenizer.json), so "
              "generation could never stop on it");
  }
  EXPECT_EQ(with_config(R"({"eos_token":{"content":"</s>"}})").eos_id(), 7);
}
