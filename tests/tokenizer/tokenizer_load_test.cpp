// Loader behaviour on small synthetic tokenizer.json files: error messages for broken files,
// tokenizer_config.json handling (tokens, add_bos_token, chat templates), BPE details whose
// expected ids follow by hand from the merges, and concurrent use. Not the golden comparison.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "io/atomic_file.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "test_paths.h"

namespace fs = std::filesystem;
using hearth::tokenizer::StreamDecoder;
using hearth::tokenizer::Tokenizer;

namespace {

// vocab: a=0 b=1 c=2 ab=3 abc=4 <unk>=5 <0xC3>=6 <0xA9>=7 ▁=8; merges "a b" (rank 0), "ab c" (rank 1).
std::string tiny_json(const std::string& model_extra = "", const std::string& rest = "") {
  return R"({"version":"1.0","added_tokens":[{"id":9,"content":"<s>","special":true,"normalized":false},
    {"id":10,"content":"<x>","special":false,"normalized":false,"lstrip":true,"rstrip":true}],
    "model":{"type":"BPE","unk_token":"<unk>","fuse_unk":true,"byte_fallback":true)" + model_extra + R"(,
      "vocab":{"a":0,"b":1,"c":2,"ab":3,"abc":4,"<unk>":5,"<0xC3>":6,"<0xA9>":7,"\u2581":8},
      "merges":["a b",["ab","c"]]})" + rest + "}";
}

std::string load_error_of(const std::string& text) {
  try {
    Tokenizer::from_json_text(text, "t.json");
  } catch (const hearth::Error& e) {
    return e.what();
  }
  return "(no error)";
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("hearth_tok_" + name + "_" + std::to_string(::getpid()));
  hearth::io::remove_tree(d);
  fs::create_directories(d);
  return d;
}
void write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

}  // namespace

TEST(TokenizerLoad, BpeMergesByRankWithByteFallbackAndUnk) {
  Tokenizer t = Tokenizer::from_json_text(tiny_json(), "t.json");
  EXPECT_EQ(t.encode("abc", false), (std::vector<int32_t>{4}));     // a b -> ab, ab c -> abc
  EXPECT_EQ(t.encode("abca", false), (std::vector<int32_t>{4, 0}));
  EXPECT_EQ(t.encode("\xC3\xA9", false), (std::vector<int32_t>{6, 7}));  // é: no token, bytes exist
  EXPECT_EQ(t.encode("zzb", false), (std::vector<int32_t>{5, 1}));  // z z fused into one <unk>
  EXPECT_EQ(t.encode("a<s>b", false), (std::vector<int32_t>{0, 9, 1}));
  EXPECT_EQ(t.encode("a  <x>  b", false), (std::vector<int32_t>{0, 10, 1}));  // lstrip/rstrip eat spaces
  EXPECT_EQ(t.vocab_size(), 11);
  EXPECT_TRUE(t.is_special(9));
  EXPECT_FALSE(t.is_special(10));
  EXPECT_EQ(t.decode({9, 4, 10}, true), "abc <x>");  // no decoder: HF joins tokens with spaces
}

TEST(TokenizerLoad, IgnoreMergesMapsWholeWord) {
  // "ba" is in the vocab but no merge builds it: only ignore_merges maps the word to it.
  auto make = [](bool ignore) {
    return Tokenizer::from_json_text(std::string(R"({"model":{"type":"BPE","ignore_merges":)") + (ignore ? "true" : "false") +
                                         R"(,"vocab":{"a":0,"b":1,"ba":2},"merges":[]}})",
                                     "t.json");
  };
  EXPECT_EQ(make(true).encode("ba", false), (std::vector<int32_t>{2}));
  EXPECT_EQ(make(false).encode("ba", false), (std::vector<int32_t>{1, 0}));
}

TEST(TokenizerLoad, ErrorsNameFileAndField) {
  EXPECT_NE(load_error_of("{not json").find("t.json: invalid JSON"), std::string::npos);
  EXPECT_NE(load_error_of(R"({"model":{"type":"WordPiece","vocab":{}}})").find("t.json: model.type: unsupported model type 'WordPiece'"),
            std::string::npos);
  EXPECT_NE(load_error_of(R"({"model":{"type":"BPE","merges":[]}})").find("t.json: model.vocab: missing"), std::string::npos);
  EXPECT_NE(load_error_of(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":["a q"]}})").find("t.json: model.merges[0]: merge token 'q'"),
            std::string::npos);
  EXPECT_NE(load_error_of(tiny_json("", R"(,"normalizer":{"type":"Bogus"})")).find("t.json: normalizer.type: unsupported normalizer type 'Bogus'"),
            std::string::npos);
  EXPECT_NE(load_error_of(tiny_json("", R"(,"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(a"},"behavior":"Isolated","invert":false})"))
                .find("t.json: pre_tokenizer.pattern.Regex: bad regex /(a/"),
            std::string::npos);
  EXPECT_NE(load_error_of(tiny_json("", R"(,"decoder":{"type":"Nope"})")).find("t.json: decoder.type: unsupported decoder type 'Nope'"),
            std::string::npos);
  EXPECT_NE(load_error_of(tiny_json("", R"(,"post_processor":{"type":"TemplateProcessing","single":["<bos>","$A"],"special_tokens":{}})"))
                .find("t.json: post_processor.single[0]: special token '<bos>' is not in special_tokens"),
            std::string::npos);
  // Found by the fuzzer: a number too large for a double escaped as nlohmann's out_of_range.
  EXPECT_NE(load_error_of(R"({"model":{"type":"BPE","vocab":{},"merges":[]},"x":1E99999})").find("t.json: invalid JSON"),
            std::string::npos);
  try {
    Tokenizer::from_dir("/nonexistent/dir");
    FAIL() << "no error";
  } catch (const hearth::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir: model folder not found"), std::string::npos) << e.what();
  }
}

TEST(TokenizerLoad, ConfigTokensBosAndChatTemplate) {
  fs::path d = temp_dir("cfg");
  write(d / "tokenizer.json", tiny_json());  // no post_processor: the config's add_bos_token applies
  write(d / "tokenizer_config.json",
        R"({"bos_token":{"content":"<s>","lstrip":false},"eos_token":"<x>","add_bos_token":true,"add_eos_token":false,
            "model_max_length":4096,"chat_template":[{"name":"tool_use","template":"T"},{"name":"default","template":"D"}]})");
  Tokenizer t = Tokenizer::from_dir(d);
  EXPECT_EQ(t.bos_token(), "<s>");
  EXPECT_EQ(t.bos_id(), 9);
  EXPECT_EQ(t.eos_id(), 10);
  EXPECT_EQ(t.chat_template(), "D");
  EXPECT_EQ(t.model_max_length(), 4096);
  EXPECT_EQ(t.encode("ab", true), (std::vector<int32_t>{9, 3}));
  EXPECT_EQ(t.encode("ab", false), (std::vector<int32_t>{3}));
  write(d / "chat_template.jinja", "J");
  EXPECT_EQ(Tokenizer::from_dir(d).chat_template(), "J");
  hearth::io::remove_tree(d);
}

TEST(TokenizerLoad, StreamDecoderHoldsBackPartialCharacters) {
  Tokenizer t = Tokenizer::from_json_text(
      tiny_json("", R"(,"decoder":{"type":"Sequence","decoders":[{"type":"ByteFallback"},{"type":"Fuse"}]})"), "t.json");
  StreamDecoder sd(t, false);
  EXPECT_EQ(sd.push(0), "a");
  EXPECT_EQ(sd.push(6), "");  // first byte of é: held back
  EXPECT_EQ(sd.push(7), "\xC3\xA9");
  EXPECT_EQ(sd.push(0), "a");
  EXPECT_EQ(sd.flush(), "");
  // A run of byte tokens that is invalid UTF-8 as a whole decodes to one U+FFFD per byte (HF).
  EXPECT_EQ(t.decode({0, 6, 7, 6}, false), "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  StreamDecoder sd2(t, false);
  std::string all = sd2.push(6) + sd2.push(6);
  EXPECT_EQ(all, "");  // ends in U+FFFD: held back
  EXPECT_EQ(sd2.flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerLoad, ConcurrentEncodeMatchesSerial) {
  fs::path dir = fs::path(HEARTH_SOURCE_DIR) / "tests/golden/tokenizer/tiny";
  ASSERT_TRUE(fs::exists(dir / "tokenizer.json")) << dir;
  Tokenizer t = Tokenizer::from_dir(dir);
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back("word" + std::to_string(i * 7919) + " and some more text " + std::to_string(i));
  std::vector<std::vector<int32_t>> serial;
  for (const auto& s : texts) serial.push_back(t.encode(s, true));
  Tokenizer fresh = Tokenizer::from_dir(dir);  // empty word cache, so threads race to fill it
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int k = 0; k < 8; ++k)
    threads.emplace_back([&, k] {
      for (int r = 0; r < 20; ++r)
        for (size_t i = 0; i < texts.size(); ++i) {
          size_t j = (i + k * 5) % texts.size();
          if (fresh.encode(texts[j], true) != serial[j]) ++mismatches;
          if (fresh.decode(serial[j], true).empty()) ++mismatches;
        }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}
