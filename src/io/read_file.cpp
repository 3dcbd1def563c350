// Checked opening (regular files only, optional root confinement) and capped whole-file reads.
// Not atomic writes (atomic_file.cpp) and not safetensors parsing (safetensors.cpp).
#include "io/read_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "core/error.h"
#include "io/atomic_file.h"

namespace hearth::io {
namespace fs = std::filesystem;

namespace {

const char* kind_name(FileKind kind) {
  switch (kind) {
    case FileKind::kConfig: return "a config file";
    case FileKind::kTokenizer: return "a tokenizer file";
    case FileKind::kText: return "a text file";
  }
  return "a file";
}

const char* type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// The real path of an open descriptor (/proc/self/fd), else canonical(path).
fs::path fd_real_path(int fd, const fs::path& path) {
  char buf[PATH_MAX + 1];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = ::readlink(link.c_str(), buf, PATH_MAX);
  if (n > 0) return fs::path(std::string(buf, static_cast<size_t>(n)));
  std::error_code ec;
  fs::path p = fs::canonical(path, ec);
  return ec ? fs::path() : p;
}

}  // namespace

uint64_t max_bytes(FileKind kind) {
  switch (kind) {
    case FileKind::kConfig: return uint64_t{64} << 20;
    case FileKind::kTokenizer: return uint64_t{256} << 20;
    case FileKind::kText: return uint64_t{16} << 20;
  }
  return uint64_t{16} << 20;
}

bool path_is_under(const fs::path& p, const fs::path& root) {
  auto pi = p.begin();
  for (auto ri = root.begin(); ri != root.end(); ++ri, ++pi) {
    if (ri->empty() && std::next(ri) == root.end()) break;  // trailing slash of the root
    if (pi == p.end() || *pi != *ri) return false;
  }
  return true;
}

bool entry_exists(const fs::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

OpenFile::OpenFile(const fs::path& path, const Roots& roots) {
  const std::string origin = path.string();
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) throw NotFound(cat(origin, ": cannot open (no such file)"));
    if (err == ELOOP) throw Error(cat(origin, ": cannot open (symlink loop: too many levels of symbolic links)"));
    throw Error(cat(origin, ": cannot open (", std::strerror(err), ")"));
  }
  try {
    struct stat st {};
    HEARTH_CHECK(::fstat(fd_, &st) == 0, origin, ": cannot stat (", std::strerror(errno), ")");
    HEARTH_CHECK(S_ISREG(st.st_mode), origin, ": not a regular file (", type_name(st.st_mode), ")");
    size_ = static_cast<uint64_t>(st.st_size);
    // Regular files never block; reads should wait for the disk as usual.
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
    real_ = fd_real_path(fd_, path);
    if (!roots.empty()) {
      bool inside = false;
      std::string list;
      for (const auto& r : roots) {
        std::error_code ec;
        const fs::path root = fs::weakly_canonical(fs::absolute(r), ec);
        inside = inside || (!ec && !real_.empty() && path_is_under(real_, root));
        list += (list.empty() ? "" : ", ") + (ec ? r : root).string();
      }
      HEARTH_CHECK(inside, origin, ": resolves (through a symlink) to a file outside the allowed folders (", list,
                   ")");
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

OpenFile::~OpenFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string read_file(const fs::path& path, FileKind kind, const Roots& roots) {
  OpenFile f(path, roots);
  const uint64_t cap = max_bytes(kind);
  auto too_big = [&](uint64_t n) {
    return Error(cat(path.string(), ": ", n, " bytes, over the ", mib(cap), " limit for ", kind_name(kind)));
  };
  if (f.size() > cap) throw too_big(f.size());
  std::string out;
  out.resize(static_cast<size_t>(f.size()));
  size_t have = 0;
  for (;;) {
    if (have == out.size()) {
      if (out.size() > cap) throw too_big(out.size());
      out.resize(std::min<uint64_t>(cap + 1, std::max<uint64_t>(out.size() * 2, 4096)));
    }
    const ssize_t n = ::read(f.fd(), out.data() + have, out.size() - have);
    if (n < 0 && errno == EINTR) continue;
    HEARTH_CHECK(n >= 0, path.string(), ": cannot read (", std::strerror(errno), ")");
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  if (have > cap) throw too_big(have);
  out.resize(have);
  return out;
}

// Declared in atomic_file.h (kept there for its many callers): the config-sized read.
std::string read_file(const fs::path& path) { return read_file(path, FileKind::kConfig); }

}  // namespace hearth::io
