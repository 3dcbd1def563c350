// Bounded, checked opening and reading of the files Hearth loads whole (config.json,
// tokenizer.json, adapter_config.json, chat templates, ...) and maps (safetensors): regular files
// only, a size cap per kind, optional confinement to allowed folders. Not for streams (datasets).
#pragma once
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace hearth::io {

/// What a whole-file read is for; each kind has its own size cap (max_bytes).
enum class FileKind {
  kConfig,     ///< JSON configs: config.json, generation_config.json, adapter_config.json,
               ///< tokenizer_config.json, checkpoint.json, *.index.json: 64 MiB
  kTokenizer,  ///< tokenizer.json: 256 MiB (the largest in the wild are ~35 MB)
  kText,       ///< chat_template.jinja and other text: 16 MiB
};

/// The byte cap of `kind`.
uint64_t max_bytes(FileKind kind);

/// Folders a file must resolve into (real path, symlinks followed); empty = anywhere.
using Roots = std::vector<std::filesystem::path>;

/// An open read-only descriptor on a regular file; closes on destruction.
class OpenFile {
 public:
  /// Opens `path` without blocking (a FIFO never hangs), then checks: it is a regular file (not a
  /// folder, FIFO, device or socket); when `roots` is non-empty, its real path (the opened file's,
  /// so a symlink swapped in later changes nothing) lies under one of them. Throws hearth::NotFound
  /// "<path>: cannot open (no such file)", or hearth::Error "<path>: cannot open (symlink loop)",
  /// "<path>: not a regular file (a FIFO)", "<path>: resolves to <real>, outside the allowed
  /// folders (<roots>)", "<path>: cannot open (<strerror>)". Never reads the file.
  OpenFile(const std::filesystem::path& path, const Roots& roots = {});
  ~OpenFile();
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;

  int fd() const { return fd_; }
  /// Size in bytes at open time (st_size).
  uint64_t size() const { return size_; }
  /// The real path of the opened file.
  const std::filesystem::path& real_path() const { return real_; }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::filesystem::path real_;
};

/// Reads the whole of `path` after OpenFile's checks, refusing files over max_bytes(kind)
/// ("<path>: 70000000 bytes, over the 64 MiB limit for a config file"), also when the file grows
/// while it is read. Errors never quote the file's bytes. (atomic_file.h's one-argument
/// read_file(path) is this with FileKind::kConfig.)
std::string read_file(const std::filesystem::path& path, FileKind kind, const Roots& roots = {});

/// True when `p` equals `root` or lies below it, compared component by component (both should be
/// absolute and normalized: canonical paths).
bool path_is_under(const std::filesystem::path& p, const std::filesystem::path& root);

/// Like std::filesystem::exists, but a dangling symlink or a symlink loop counts as existing (so
/// that opening it reports what is wrong instead of "no such file").
bool entry_exists(const std::filesystem::path& p);

}  // namespace hearth::io
