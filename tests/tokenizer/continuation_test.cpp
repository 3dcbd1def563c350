// Decoding a token against the tokens before it (Tokenizer::continuation_bytes, decode_bytes and
// StreamDecoder's context): what logprobs report and what a completion streams. Expected values
// follow HF tokenizers' decoders by hand: SentencePiece-style decoders drop the space of "▁x"
// only at the start of a text, byte tokens stand for their raw bytes.
#include <gtest/gtest.h>

#include <string>

#include "tokenizer/tokenizer.h"

using hearth::tokenizer::StreamDecoder;
using hearth::tokenizer::Tokenizer;

namespace {
// Llama-2 style: Replace ▁ -> " ", ByteFallback, Fuse, Strip one leading space.
const char* kLlamaDecoder =
    R"({"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})";
// Mistral/T5 style: Metaspace with prepend_scheme "first".
const char* kMetaspaceDecoder = R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false})";

// ids: <unk>=0 ▁Paris=1 ▁is=2 ▁a=3 ▁and=4 <0xE9>=5 <0xC3>=6 <0xA9>=7 x=8
Tokenizer sp_tokenizer(const char* decoder) {
  return Tokenizer::from_json_text(std::string(R"({"version": "1.0", "added_tokens": [],
      "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "vocab": {"<unk>": 0,
        "\u2581Paris": 1, "\u2581is": 2, "\u2581a": 3, "\u2581and": 4, "<0xE9>": 5, "<0xC3>": 6, "<0xA9>": 7, "x": 8},
        "merges": []}, "decoder": )") + decoder + "}",
                                   "sp.json");
}
}  // namespace

TEST(TokenizerContinuation, SentencePieceTokensKeepTheirSpaceAfterContext) {
  for (const char* dec : {kLlamaDecoder, kMetaspaceDecoder}) {
    Tokenizer t = sp_tokenizer(dec);
    EXPECT_EQ(t.decode({4}, false), "and") << dec;  // alone: the start-of-text space is dropped
    EXPECT_EQ(t.continuation_bytes({1}, 4), " and") << dec;
    EXPECT_EQ(t.continuation_bytes({1, 2}, 3), " a") << dec;
    EXPECT_EQ(t.continuation_bytes({3}, 8), "x") << dec;
    EXPECT_EQ(t.continuation_bytes({}, 4), "and") << dec;  // no context: the start of a text
    // The pieces rebuild the text.
    std::string rebuilt = t.decode({1}, false);
    std::vector<int32_t> ctx = {1};
    for (int32_t id : {2, 3, 4, 8}) {
      rebuilt += t.continuation_bytes(ctx, id);
      ctx.push_back(id);
    }
    EXPECT_EQ(rebuilt, t.decode({1, 2, 3, 4, 8}, false)) << dec;
    EXPECT_EQ(rebuilt, "Paris is a andx") << dec;
  }
}

TEST(TokenizerContinuation, ByteTokensGiveTheirRawBytes) {
  Tokenizer t = sp_tokenizer(kLlamaDecoder);
  EXPECT_EQ(t.decode({5}, false), "\xEF\xBF\xBD");  // decode() stays valid UTF-8 (HF)
  EXPECT_EQ(t.decode_bytes({5}, false), "\xE9");
  EXPECT_EQ(t.continuation_bytes({1}, 5), "\xE9");
  EXPECT_EQ(t.continuation_bytes({1, 6}, 7), "\xA9");  // second byte of é
  EXPECT_EQ(t.decode({6, 7}, false), "\xC3\xA9");
  EXPECT_EQ(t.decode({6, 7, 6}, false), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // HF: invalid run, one U+FFFD per byte
  EXPECT_EQ(t.decode_bytes({6, 7, 6}, false), "\xC3\xA9\xC3");
  // Byte-level BPE: "Ã" and "©" stand for the bytes 0xC3 and 0xA9.
  Tokenizer bl = Tokenizer::from_json_text(
      R"({"version": "1.0", "added_tokens": [], "model": {"type": "BPE", "vocab": {"\u00c3": 0, "\u00a9": 1, "a": 2},
        "merges": []}, "decoder": {"type": "ByteLevel"}})",
      "bl.json");
  EXPECT_EQ(bl.decode({0}, false), "\xEF\xBF\xBD");
  EXPECT_EQ(bl.decode_bytes({0}, false), "\xC3");
  EXPECT_EQ(bl.continuation_bytes({2, 0}, 1), "\xA9");
  EXPECT_EQ(bl.continuation_bytes({2}, 0), "\xC3");
}

TEST(TokenizerContinuation, StreamDecoderContinuesTheContext) {
  Tokenizer t = sp_tokenizer(kMetaspaceDecoder);
  StreamDecoder plain(t, true);
  EXPECT_EQ(plain.push(3), "a");  // a stream of its own starts a text
  StreamDecoder sd(t, true, {1, 2});  // "Paris is"
  std::string out = sd.push(3);
  out += sd.push(4);
  out += sd.flush();
  EXPECT_EQ(out, " a and");
  // Partial characters are still held back after a context.
  Tokenizer llama = sp_tokenizer(kLlamaDecoder);
  StreamDecoder bytes(llama, true, {1});
  EXPECT_EQ(bytes.push(6), "");
  EXPECT_EQ(bytes.push(7), "\xC3\xA9");
  EXPECT_EQ(bytes.flush(), "");
}
