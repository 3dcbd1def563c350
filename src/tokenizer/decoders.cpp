// Decoders ported from HF tokenizers (decoders/*.rs, pre_tokenizers/byte_level.rs and
// metaspace.rs decode_chain). Not the streaming detokenizer (stream_decoder.h).
#include "tokenizer/decoders.h"

#include "tokenizer/normalizers.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace hearth::tokenizer {

std::string Decoder::decode(std::vector<std::string> tokens, bool raw) const {
  std::string out;
  for (const auto& t : decode_chain(std::move(tokens), raw)) out += t;
  return out;
}

namespace {

// Tokens whose characters are all in the byte-level alphabet become those bytes; others keep
// their own UTF-8 bytes. The byte string is then read as UTF-8, lossy.
class ByteLevelDec : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, [[maybe_unused]] bool raw) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      std::string mine;
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        auto p = unicode::decode_at(t, i);
        int b = unicode::unicode_to_byte(p.cp);
        if (b < 0) all = false;
        else mine += static_cast<char>(b);
        i += p.len;
      }
      bytes += all ? mine : t;
    }
    if (raw) return {bytes};
    return {unicode::to_valid_utf8(bytes)};
  }
};

// "<0xNN>" tokens are gathered into bytes; a run that is not valid UTF-8 becomes one U+FFFD per byte.
class ByteFallbackDec : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, [[maybe_unused]] bool raw) const override {
    std::vector<std::string> out;
    std::string run;
    auto flush = [&] {
      if (run.empty()) return;
      if (raw || unicode::is_valid_utf8(run)) out.push_back(run);
      else
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      run.clear();
    };
    for (auto& t : tokens) {
      int byte = parse_byte(t);
      if (byte >= 0) {
        run += static_cast<char>(byte);
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    return out;
  }

 private:
  // Rust: len == 6 && starts_with("<0x") && ends_with('>') && u8::from_str_radix(&t[3..5], 16).
  static int parse_byte(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    auto hex = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    char a = t[3], b = t[4];
    if (a == '+') return hex(b);  // from_str_radix accepts a leading '+'
    int x = hex(a), y = hex(b);
    return x < 0 || y < 0 ? -1 : x * 16 + y;
  }
};

class FuseDec : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, [[maybe_unused]] bool raw) const override {
    std::string s;
    for (const auto& t : tokens) s += t;
    return {s};
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters from each token.
class StripDec : public Decoder {
 public:
  StripDec(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, [[maybe_unused]] bool raw) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
      for (size_t i = 0; i < t.size();) {
        auto p = unicode::decode_at(t, i);
        chars.emplace_back(i, p.cp);
        i += p.len;
      }
      size_t start_cut = 0;
      for (size_t i = 0; i < start_ && i < chars.size(); ++i) {
        if (chars[i].second != content_) break;
        start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        size_t index = chars.size() - i - 1;
        if (chars[index].second != content_) break;
        stop_cut = index;
      }
      if (stop_cut <= start_cut) {
        t.clear();
        continue;
      }
      size_t b = start_cut < chars.size() ? chars[start_cut].first : t.size();
      size_t e = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(b, e - b);
    }
    return tokens;
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDec : public Decoder {
 public:
  ReplaceDec(Regex re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, [[maybe_unused]] bool raw) const override {
    for (auto& t : tokens) {
      std::string s;
      for (const auto& sp : find_matches(re_, t)) {
        if (sp.is_match) s += content_;
        else s.append(t, sp.start, sp.end - sp.start);
      }
      t = std::move(s);
    }
    return tokens;
  }

 private:
  Regex re_;
  std::string content_;
};

// Metaspace decode: the replacement becomes ' ', except in the first token when a prefix was
// prepended (prepend_scheme != never), where it is dropped.
class MetaspaceDec : public Decoder {
 public:
  MetaspaceDec(char32_t rep, bool prepend) : rep_(rep), prepend_(prepend) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, [[maybe_unused]] bool raw) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      const std::string& t = tokens[k];
      std::string s;
      for (size_t i = 0; i < t.size();) {
        auto p = unicode::decode_at(t, i);
        if (p.cp == rep_) {
          if (!(k == 0 && prepend_)) s += ' ';
        } else {
          s.append(t, i, p.len);
        }
        i += p.len;
      }
      tokens[k] = std::move(s);
    }
    return tokens;
  }

 private:
  char32_t rep_;
  bool prepend_;
};

// HF BPEDecoder: the suffix becomes ' ' (none on the last token).
class BpeDec : public Decoder {
 public:
  explicit BpeDec(std::string suffix) : suffix_(std::move(suffix)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, [[maybe_unused]] bool raw) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string& t = tokens[k];
      std::string rep = k + 1 == tokens.size() ? "" : " ";
      std::string s;
      size_t pos = 0;
      while (!suffix_.empty()) {
        size_t f = t.find(suffix_, pos);
        if (f == std::string::npos) break;
        s.append(t, pos, f - pos);
        s += rep;
        pos = f + suffix_.size();
      }
      s.append(t, pos, std::string::npos);
      t = std::move(s);
    }
    return tokens;
  }

 private:
  std::string suffix_;
};

class SequenceDec : public Decoder {
 public:
  explicit SequenceDec(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, [[maybe_unused]] bool raw) const override {
    for (const auto& p : parts_) tokens = p->decode_chain(std::move(tokens), raw);
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

char32_t one_char(const nlohmann::json& j, const char* key, const jf::At& at) {
  std::string s = jf::str(jf::need(j, key, at), at / key);
  if (s.empty() || !unicode::is_valid_utf8(s) || static_cast<size_t>(unicode::decode_at(s, 0).len) != s.size())
    (at / key).fail("expected exactly one character");
  return unicode::decode_at(s, 0).cp;
}

size_t count(const nlohmann::json& j, const char* key, const jf::At& at) {
  int64_t v = jf::integer(jf::need(j, key, at), at / key);
  if (v < 0) (at / key).fail("must be >= 0");
  return static_cast<size_t>(v);
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const jf::At& at) {
  std::string type = jf::str(jf::need(j, "type", at), at / "type");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDec>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDec>();
  if (type == "Fuse") return std::make_unique<FuseDec>();
  if (type == "Strip") return std::make_unique<StripDec>(one_char(j, "content", at), count(j, "start", at), count(j, "stop", at));
  if (type == "Replace")
    return std::make_unique<ReplaceDec>(make_pattern(jf::need(j, "pattern", at), at / "pattern"),
                                        jf::str(jf::need(j, "content", at), at / "content"));
  if (type == "Metaspace") {
    std::string scheme = jf::opt_str(j, "prepend_scheme", "always", at);
    if (scheme != "always" && scheme != "first" && scheme != "never")
      (at / "prepend_scheme").fail(cat("unknown prepend_scheme '", scheme, "'"));
    bool prepend = scheme != "never";
    if (auto it = j.find("add_prefix_space"); it != j.end() && it->is_boolean() && !it->get<bool>()) prepend = false;
    return std::make_unique<MetaspaceDec>(one_char(j, "replacement", at), prepend);
  }
  if (type == "BPEDecoder") return std::make_unique<BpeDec>(jf::opt_str(j, "suffix", "</w>", at));
  if (type == "Sequence") {
    const auto& arr = jf::need(j, "decoders", at);
    if (!arr.is_array()) (at / "decoders").fail("expected an array");
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < arr.size(); ++i) parts.push_back(make_decoder(arr[i], (at / "decoders")[i]));
    return std::make_unique<SequenceDec>(std::move(parts));
  }
  (at / "type").fail(cat("unsupported decoder type '", type, "'"));
}

}  // namespace hearth::tokenizer
