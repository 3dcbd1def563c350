// PCRE2-backed regex with Oniguruma-compatible semantics for tokenizer.json patterns.
// Not a full Oniguruma emulation: only the differences that real tokenizer patterns hit.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"

namespace hearth::tokenizer {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {
// Oniguruma's `\s` for UTF-8 is Unicode White_Space; PCRE2's UCP `\s` also takes U+180E.
constexpr std::string_view kSpaceSet =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string translate(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kSpaceSet) : "[" + std::string(kSpaceSet) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kSpaceSet) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

std::string escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}-#&~ \t\n\r\f\v").find(c) != std::string_view::npos) {
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
        out += c;  // literal whitespace matches itself (no PCRE2_EXTENDED)
        continue;
      }
      out += '\\';
    }
    out += c;
  }
  return out;
}
}  // namespace

Regex Regex::compile(std::string_view pattern, const std::string& where) {
  std::string translated = translate(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(cat(where, ": bad regex /", pattern, "/: ", reinterpret_cast<char*>(msg)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: falls back to the interpreter
  Regex re;
  auto c = std::make_shared<Code>();
  c->code = code;
  re.code_ = std::move(c);
  return re;
}

Regex Regex::literal(std::string_view text, const std::string& where) {
  return compile(escape(text), where);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  HEARTH_CHECK(md, "regex: out of memory");
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (last_end <= text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), last_end, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error(cat("regex match failed: ", reinterpret_cast<char*>(msg)));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t s = ov[0], e = ov[1];
    if (e < s) e = s;  // \K tricks; never produce an inverted span
    if (s == e && have_last && last_match_end == e) {
      last_end += last_end < text.size() ? unicode::utf8_len(static_cast<unsigned char>(text[last_end])) : 1;
      continue;
    }
    last_end = e;
    last_match_end = e;
    have_last = true;
    out.emplace_back(s, e);
  }
  pcre2_match_data_free(md);
  return out;
}

std::vector<Span> find_matches(const Regex& re, std::string_view text, bool invert) {
  std::vector<Span> out;
  if (text.empty()) {
    out.push_back({0, 0, invert});
    return out;
  }
  size_t prev = 0;
  for (auto [s, e] : re.find_all(text)) {
    if (prev != s) out.push_back({prev, s, invert});
    out.push_back({s, e, !invert});
    prev = e;
  }
  if (prev != text.size()) out.push_back({prev, text.size(), invert});
  return out;
}

}  // namespace hearth::tokenizer
