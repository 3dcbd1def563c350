// Text from files or requests made safe to quote in a one-line message: control bytes escaped,
// long text cut. Not a JSON or shell escaper.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace hearth {

/// `s` with bytes < 0x20 and 0x7f written as \xNN (a NUL no longer ends the message), cut to
/// `max_chars` bytes with "..." appended when longer.
inline std::string printable(std::string_view s, size_t max_chars = 200) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s.substr(0, max_chars)) {
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return s.size() > max_chars ? out + "..." : out;
}

/// True when `s` holds a control byte (< 0x20 or 0x7f).
inline bool has_control_chars(std::string_view s) {
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return true;
  return false;
}

}  // namespace hearth
