// Unicode and byte helpers for the tokenizer: UTF-8 walking and repair, character classes with the
// semantics Rust's `char` methods have (what HF tokenizers uses), ICU normalization, and the GPT-2
// byte-level alphabet. Not a regex engine (regex.h) and not a general text library.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace hearth::tokenizer::unicode {

/// The code point starting at byte `i` of `s` (which must be valid UTF-8) and its byte length.
struct CodePoint {
  char32_t cp;
  int len;
};
CodePoint decode_at(std::string_view s, size_t i);

/// Appends the UTF-8 encoding of `cp` to `out`.
void append_utf8(std::string& out, char32_t cp);

/// Byte length of the UTF-8 sequence whose lead byte is `lead` (1 for a stray continuation byte).
int utf8_len(unsigned char lead);

/// True when `s` is well-formed UTF-8.
bool is_valid_utf8(std::string_view s);

/// `s` with every ill-formed sequence replaced by U+FFFD, one per maximal invalid subpart
/// (Rust's String::from_utf8_lossy and Python's errors="replace" behave the same way).
std::string to_valid_utf8(std::string_view s);

/// Rust `char::is_whitespace` (Unicode White_Space).
bool is_whitespace(char32_t c);
/// Rust `char::is_numeric` (general categories Nd, Nl, No).
bool is_numeric(char32_t c);
/// HF's Punctuation pre-tokenizer test: ASCII punctuation or any Unicode P* category.
bool is_punctuation(char32_t c);
/// Rust regex `\w` (Alphabetic, M*, Nd, Pc, Join_Control).
bool is_word_char(char32_t c);

/// Each code point replaced by its full lowercase mapping, one code point at a time
/// (Rust `char::to_lowercase`; no context-sensitive final sigma).
std::string lowercase(std::string_view s);

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
/// Unicode normalization through ICU's Normalizer2. `s` must be valid UTF-8.
std::string normalize(std::string_view s, NormalForm form);

/// GPT-2's byte-level alphabet: byte b -> the UTF-8 text of its printable stand-in character.
const std::array<std::string, 256>& byte_to_unicode();
/// Inverse of byte_to_unicode for one code point: the byte, or -1 when `c` is not in the alphabet.
int unicode_to_byte(char32_t c);

}  // namespace hearth::tokenizer::unicode
