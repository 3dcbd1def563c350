// Small helpers shared by tests of several folders. Not used by library code.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <functional>
#include <string>

#include "core/error.h"

namespace hearth::testing {

/// The message of the hearth::Error that `f` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const hearth::Error& e) {
    return e.what();
  }
  return "";
}

/// Exit code and output of one `hearth` CLI run (HEARTH_BINARY, a compile definition of the tests).
struct CliResult {
  int rc;
  std::string out;
};

#ifdef HEARTH_BINARY
/// Runs `hearth ARGS` through the shell; stdout (and stderr when merge_stderr) captured.
inline CliResult run_hearth(const std::string& args, bool merge_stderr = true) {
  std::string cmd = std::string(HEARTH_BINARY) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  int rc = pclose(p);
  return {WEXITSTATUS(rc), out};
}
#endif

/// `s` single-quoted for a POSIX shell.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace hearth::testing
