// Small helpers shared by tests of several folders. Not used by library code.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "test_paths.h"

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

/// Starts `/bin/sh -c "exec CMD"` in the background, in its own process group, with stdout and
/// stderr appended to `log`, `set_env` added to and `unset_env` removed from its environment.
/// Returns the pid (-1 when fork fails). Stop it with stop_process.
inline pid_t start_process(const std::string& cmd, const std::string& log,
                           const std::vector<std::pair<std::string, std::string>>& set_env = {},
                           const std::vector<std::string>& unset_env = {}) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::setpgid(0, 0);
  for (const auto& [k, v] : set_env) ::setenv(k.c_str(), v.c_str(), 1);
  for (const auto& k : unset_env) ::unsetenv(k.c_str());
  FILE* f = std::fopen(log.c_str(), "a");
  if (f) {
    ::dup2(::fileno(f), 1);
    ::dup2(::fileno(f), 2);
  }
  const std::string line = "exec " + cmd;
  ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
  ::_exit(127);
}

/// Waits up to `timeout_s` for `pid` to exit; returns its wait status, or -1 on timeout.
inline int wait_process(pid_t pid, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    if (std::chrono::steady_clock::now() > end) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

/// Sends `sig` to the process group of `pid` and waits up to `timeout_s`; after that, SIGKILLs the
/// group, reaps it and returns -1. Otherwise returns the wait status.
inline int stop_process(pid_t pid, int sig, double timeout_s) {
  ::kill(-pid, sig);
  int status = wait_process(pid, timeout_s);
  if (status != -1) return status;
  ::kill(-pid, SIGKILL);
  wait_process(pid, 10);
  return -1;
}

/// The whole text of file `path` ("" when unreadable).
inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Polls `log` until `re` matches in it (returns submatch 1, or the whole match without groups),
/// `pid` exits, or `timeout_s` passes (both: returns "").
inline std::string wait_for_log(const std::string& log, const std::regex& re, pid_t pid, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    const std::string text = read_text(log);
    std::smatch m;
    if (std::regex_search(text, m, re)) return m.size() > 1 ? m[1].str() : m[0].str();
    siginfo_t info{};
    if (::waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == pid) return "";  // exited (not reaped)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "";
}

}  // namespace hearth::testing
