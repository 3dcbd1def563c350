// Output folders of convert and fuse (output_folder.h): checks, stale temp cleanup, signals.
#include "cli/output_folder.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <iostream>
#include <vector>

#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"

namespace hearth::cli {
namespace fs = std::filesystem;

namespace {

// The signal number that arrived inside an OutputSignalScope (0: none).
std::atomic<int> g_output_signal{0};
extern "C" void on_output_signal(int sig) { g_output_signal.store(sig); }

// Installs the SIGINT/SIGTERM flag handlers for its lifetime (one-shot: a second signal gets the
// default action), restoring the previous ones after.
struct OutputSignalScope {
  struct sigaction old_int {}, old_term {};
  OutputSignalScope() {
    g_output_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_output_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }
  ~OutputSignalScope() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
  OutputSignalScope(const OutputSignalScope&) = delete;
  OutputSignalScope& operator=(const OutputSignalScope&) = delete;
};

// Removes "<out>.tmp.<pid>" folders beside `out` that a run killed outright (SIGKILL, a crash)
// left behind: only that name, only holding write_dir_atomic's partial marker, and only for
// processes that no longer run.
void remove_stale_output_temps(const std::string& verb, const fs::path& out) {
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  const std::string prefix = out.filename().string() + ".tmp.";
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // running (or not ours)
    // Only a folder that write_dir_atomic marked: not a person's "model.tmp.20240101" backup.
    if (e.is_directory(ec) && !e.is_symlink(ec) && fs::is_regular_file(fs::symlink_status(e.path() / io::kPartialMarker, ec)))
      stale.push_back(e.path());
  }
  for (const auto& p : stale)
    if (io::remove_tree(p) >= 0)
      std::cout << "removed " << p.string() << ", the partial output of a " << verb << " that was killed\n";
}

}  // namespace

fs::path without_trailing_slash(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return fs::path(p);
}

bool same_or_inside(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const auto a = fs::weakly_canonical(fs::absolute(inner, ec), ec);
  if (ec) return false;
  const auto b = fs::weakly_canonical(fs::absolute(outer, ec), ec);
  if (ec) return false;
  auto i = a.begin(), j = b.begin();
  for (; j != b.end(); ++i, ++j) {
    if (j->empty() && std::next(j) == b.end()) break;  // a trailing "" element
    if (i == a.end() || *i != *j) return false;
  }
  return true;
}

void check_new_output_folder(const std::string& verb, const fs::path& out) {
  std::error_code ec;
  // symlink_status: a link whose target is missing exists too (the rename would fail on it after the work).
  const fs::file_status st = fs::symlink_status(out, ec);
  HEARTH_CHECK(!fs::is_symlink(st) || fs::exists(out, ec), out.string(), ": is a symlink to ",
               fs::read_symlink(out, ec).string(), ", which does not exist (", verb,
               " writes a new folder; remove the link or pass another --out)");
  HEARTH_CHECK(!fs::exists(st), out.string(), ": already exists (", verb, " writes a new folder)");
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  HEARTH_CHECK_T(NotFound, fs::is_directory(parent, ec), parent.string(), ": output's parent folder not found");
}

void check_output_signal() {
  if (const int sig = g_output_signal.load()) throw OutputInterrupted{sig};
}

int write_new_folder(const std::string& verb, const fs::path& out, const std::function<void()>& write) {
  remove_stale_output_temps(verb, out);
  const OutputSignalScope signals;
  const fs::path tmp = io::temp_dir_for(out);
  try {
    write();
  } catch (const OutputInterrupted& i) {
    io::remove_tree(tmp);
    std::cout.flush();
    std::cerr << "hearth: " << verb << " interrupted (" << (i.sig == SIGINT ? "SIGINT" : "SIGTERM")
              << "): removed the partial " << tmp.string() << "; nothing was written to " << out.string() << "\n";
    return 128 + i.sig;
  }
  return 0;
}

}  // namespace hearth::cli
