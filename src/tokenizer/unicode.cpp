// UTF-8 helpers, Rust-compatible character classes (via ICU properties) and ICU normalization.
// Not a regex engine; see regex.cpp for pattern matching.
#include "tokenizer/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>

#include "core/error.h"

namespace hearth::tokenizer::unicode {

int utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

CodePoint decode_at(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  int n = utf8_len(c);
  if (n == 1 || i + n > s.size()) return {c, 1};
  char32_t cp = n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (b(i + k) & 0x3F);
  return {cp, n};
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {
// Length of the well-formed sequence at s[i] (Unicode Table 3-7), or -(bytes of the maximal
// invalid subpart) when ill-formed.
int checked_len(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  int n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -k;
    unsigned char x = b(i + k);
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (x < l || x > h) return -k;
  }
  return n;
}
}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    int n = checked_len(s, i);
    if (n < 0) return false;
    i += n;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    int n = checked_len(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += -n;
    }
  }
  return out;
}

bool is_whitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  int gc = u_charType(static_cast<UChar32>(c));
  return gc == U_DECIMAL_DIGIT_NUMBER || gc == U_LETTER_NUMBER || gc == U_OTHER_NUMBER;
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) ||
                       (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_P_MASK) != 0;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  UChar32 u = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL)) return true;
  uint32_t mask = U_GET_GC_MASK(u);
  return (mask & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    CodePoint p = decode_at(s, i);
    i += p.len;
    if (p.cp < 0x80) {
      out += static_cast<char>(p.cp >= 'A' && p.cp <= 'Z' ? p.cp + 32 : p.cp);
      continue;
    }
    UChar src[2];
    int32_t src_len = 0;
    U16_APPEND_UNSAFE(src, src_len, static_cast<UChar32>(p.cp));
    UChar dst[8];
    UErrorCode err = U_ZERO_ERROR;
    int32_t n = u_strToLower(dst, 8, src, src_len, "", &err);
    if (U_FAILURE(err)) {
      append_utf8(out, p.cp);
      continue;
    }
    for (int32_t k = 0; k < n;) {
      UChar32 cp;
      U16_NEXT(dst, k, n, cp);
      append_utf8(out, static_cast<char32_t>(cp));
    }
  }
  return out;
}

std::string normalize(std::string_view s, NormalForm form) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::kNFC: n = icu::Normalizer2::getNFCInstance(err); break;
    case NormalForm::kNFD: n = icu::Normalizer2::getNFDInstance(err); break;
    case NormalForm::kNFKC: n = icu::Normalizer2::getNFKCInstance(err); break;
    case NormalForm::kNFKD: n = icu::Normalizer2::getNFKDInstance(err); break;
  }
  HEARTH_CHECK(U_SUCCESS(err) && n, "ICU: cannot load normalizer data: ", u_errorName(err));
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);  // ASCII is invariant under every normal form
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  icu::UnicodeString r = n->normalize(u, err);
  HEARTH_CHECK(U_SUCCESS(err), "ICU: normalization failed: ", u_errorName(err));
  std::string out;
  r.toUTF8String(out);
  return out;
}

namespace {
struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int, 512> to_byte{};
  ByteTables() {
    to_byte.fill(-1);
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = direct[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(to_unicode[b], cp);
      to_byte[cp] = b;
    }
  }
};
const ByteTables& tables() {
  static const ByteTables t;
  return t;
}
}  // namespace

const std::array<std::string, 256>& byte_to_unicode() { return tables().to_unicode; }

int unicode_to_byte(char32_t c) { return c < 512 ? tables().to_byte[c] : -1; }

}  // namespace hearth::tokenizer::unicode
