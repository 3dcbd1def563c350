// Atomic file writes (temp file in the same folder + fsync + rename) and tree removal.
// Not a general file API: no appends; reads live in read_file.cpp.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace hearth::io {
namespace fs = std::filesystem;

namespace {

fs::path temp_path_for(const fs::path& path) {
  return fs::path(path.string() + ".tmp." + std::to_string(::getpid()));
}

// fsyncs a file (or folder) by path; best effort for folders.
void fsync_path(const fs::path& p, bool required) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    HEARTH_CHECK(!required, p.string(), ": cannot open for fsync (", std::strerror(errno), ")");
    return;
  }
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  HEARTH_CHECK(!required || rc == 0, p.string(), ": fsync failed (", std::strerror(err), ")");
}

void finish(const fs::path& tmp, const fs::path& path) {
  fsync_path(tmp, true);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    const std::string why = fs::is_directory(path) ? "a folder is in the way" : ec.message();
    fs::remove(tmp, ec);
    throw Error(cat(path.string(), ": cannot rename temp file into place (", why, ")"));
  }
  fs::path parent = path.parent_path();
  fsync_path(parent.empty() ? fs::path(".") : parent, false);
}

// The pid of a temp_path_for name ("<name>.tmp.<digits>"), or -1.
long long temp_owner(const std::string& name) {
  const auto pos = name.rfind(".tmp.");
  if (pos == std::string::npos || pos == 0) return -1;
  const std::string digits = name.substr(pos + 5);
  if (digits.empty() || digits.size() > 9) return -1;  // pids fit in 9 digits (pid_max <= 2^22)
  for (char c : digits)
    if (c < '0' || c > '9') return -1;
  return std::stoll(digits);
}

}  // namespace

int64_t remove_stale_temporaries(const fs::path& dir) noexcept {
  int64_t removed = 0;
  try {
    std::error_code ec;
    std::vector<fs::path> stale;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const long long pid = temp_owner(e.path().filename().string());
      if (pid <= 0 || pid == ::getpid()) continue;
      if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // running (or not ours to probe)
      stale.push_back(e.path());
    }
    for (const auto& p : stale)
      if (remove_tree(p) > 0) ++removed;
  } catch (...) {
  }
  return removed;
}

void write_file_atomic(const fs::path& path, const std::function<void(std::ostream&)>& fill) {
  const fs::path tmp = temp_path_for(path);
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      HEARTH_CHECK(out.good(), path.string(), ": cannot open for writing (", std::strerror(errno), ")");
      fill(out);
      out.flush();
      HEARTH_CHECK(out.good(), path.string(), ": write failed (", std::strerror(errno), ")");
    }
    finish(tmp, path);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

void write_file_atomic(const fs::path& path, std::string_view bytes) {
  write_file_atomic(path, [&](std::ostream& out) { out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); });
}

namespace {
thread_local int64_t g_removed = 0;
int remove_entry(const char* p, const struct stat*, int, struct FTW*) {
  if (::remove(p) != 0) return -1;
  ++g_removed;
  return 0;
}
}  // namespace

int64_t remove_tree(const std::filesystem::path& path) noexcept {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? 0 : -1;
  g_removed = 0;
  if (::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) return -1;
  return g_removed;
}

}  // namespace hearth::io
