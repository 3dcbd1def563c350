// libFuzzer target: the input bytes are tokenizer.json text. A file that loads must then encode and
// decode a fixed text (and stream-decode its ids) without crashing; load errors must be
// hearth::Error. Not a correctness test (tests/tokenizer/ compares against HF goldens).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using hearth::tokenizer::StreamDecoder;
  using hearth::tokenizer::Tokenizer;
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    Tokenizer tok = Tokenizer::from_json_text(text, "fuzz.json");
    static const std::string kSample = "Hello, world! It's 2024 <s> h\xC3\xA9llo \xF0\x9F\x98\x80\n\n  \t x\xE2\x96\x81y <|bos|>";
    for (bool special : {false, true}) {
      std::vector<int32_t> ids = tok.encode(kSample, special);
      tok.decode(ids, false);
      tok.decode(ids, true);
      StreamDecoder sd(tok, !special);
      for (int32_t id : ids) sd.push(id);
      sd.flush();
    }
    std::vector<int32_t> some;
    for (int32_t i = -1; i < 40 && i <= tok.vocab_size(); ++i) some.push_back(i);
    tok.decode(some, false);
    tok.token_to_id("a");
    tok.id_to_token(0);
  } catch (const hearth::Error&) {
    // Expected for malformed input.
  }
  return 0;
}
