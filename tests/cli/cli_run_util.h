// Running the built `hearth` binary from CLI tests: its exit code, stdout and stderr, and the
// "exactly one stderr line naming the problem" check the house rule asks of every bad input.
// Shared by tests/cli/*_test.cpp; not a test itself.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "../io/io_test_util.h"
#include "../test_util.h"
#include "io/atomic_file.h"
#include "test_paths.h"

namespace hearth::testing {

/// What one run of the binary left: exit code (-1 when it did not exit normally), stdout, stderr.
struct CliRunResult {
  int rc = -1;
  std::string out, err;
};

/// Runs `HEARTH_BINARY args` through the shell with stdin from `stdin_file` (/dev/null by
/// default), stderr captured in `scratch`/cli_stderr.txt; `args` is shell text (quote paths with
/// shell_quote).
inline CliRunResult run_hearth_cli(const std::string& args, const TempDir& scratch,
                                   const std::string& stdin_file = "/dev/null") {
  const std::filesystem::path err = scratch / "cli_stderr.txt";
  const std::string cmd =
      std::string(HEARTH_BINARY) + " " + args + " 2>" + shell_quote(err.string()) + " <" + shell_quote(stdin_file);
  CliRunResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = hearth::io::read_file(err);
  return r;
}

/// Exit 1 and exactly one stderr line, "hearth: error: ..." containing `needle`.
inline void expect_one_line_cli_error(const CliRunResult& r, const std::string& needle) {
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("hearth: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "want: " << needle << "\ngot: " << r.err;
}

}  // namespace hearth::testing
