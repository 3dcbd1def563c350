// Hearth's error type and check macros: every user-facing failure is a hearth::Error whose message
// is one line naming the file/field and what is wrong. Not a logging facility (see log.h).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace hearth {

/// A user-facing error: `what()` is one line, "<where>: <what is wrong>", fit to print as-is.
/// The CLI prints it after "hearth: error: " and exits 1; the server maps it to a 4xx JSON error.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// Bad input in a request or file that a caller can fix (server: 400).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A file or resource that does not exist (server: 404).
class NotFound : public Error {
 public:
  using Error::Error;
};

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

/// Concatenates the arguments with operator<< into one string.
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

}  // namespace hearth

/// Throws hearth::Error(cat(args...)) when `cond` is false.
#define HEARTH_CHECK(cond, ...)                        \
  do {                                                 \
    if (!(cond)) throw ::hearth::Error(::hearth::cat(__VA_ARGS__)); \
  } while (0)

/// Throws ExcType(cat(args...)) when `cond` is false (ExcType derives from hearth::Error).
#define HEARTH_CHECK_T(ExcType, cond, ...)             \
  do {                                                 \
    if (!(cond)) throw ExcType(::hearth::cat(__VA_ARGS__)); \
  } while (0)
