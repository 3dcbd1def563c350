// Writing a whole folder atomically: fill a temp folder beside the target, then rename it into
// place. Not a general file API (io/atomic_file.h writes single files).
#pragma once
#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2, RENAME_NOREPLACE (glibc >= 2.28)
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <functional>
#include <string>

#include "core/error.h"
#include "io/atomic_file.h"

namespace hearth::io {

/// The temp folder write_dir_atomic fills for `dir`: "<dir>.tmp.<pid>" beside it (a trailing
/// slash of `dir` ignored).
inline std::filesystem::path temp_dir_for(const std::filesystem::path& dir) {
  const std::filesystem::path target = dir.has_filename() ? dir : dir.parent_path();
  return std::filesystem::path(target.string() + ".tmp." + std::to_string(::getpid()));
}

/// The file write_dir_atomic puts in its temp folder while it fills it (removed just before the
/// rename): what marks a "<dir>.tmp.<pid>" folder as a partial output that a cleanup may remove.
inline constexpr const char* kPartialMarker = ".hearth-partial";

/// Calls `fill(tmp)` on a fresh temp folder temp_dir_for(dir) (holding kPartialMarker while it is
/// filled) and renames it to `dir`. When `replace` and `dir` exists, the old folder is moved aside
/// and removed after the rename. When not `replace`, an existing `dir` is an error before `fill`,
/// and the rename never replaces anything (renameat2 RENAME_NOREPLACE; where the file system lacks
/// it, rename(2), which fails on a non-empty folder): a `dir` made while `fill` ran (another run, a
/// person) is kept, and the error names the temp folder left with the result. A missing parent
/// folder is created. On exception (from `fill` too) the temp folder is removed and the exception
/// rethrown. Throws hearth::Error naming the folder when it cannot be created or renamed.
inline void write_dir_atomic(const std::filesystem::path& dir, bool replace,
                             const std::function<void(const std::filesystem::path&)>& fill) {
  namespace fs = std::filesystem;
  const fs::path target = dir.has_filename() ? dir : dir.parent_path();
  HEARTH_CHECK(replace || !fs::exists(target), target.string(), ": already exists (choose a new output folder)");
  if (target.has_parent_path() && !fs::exists(target.parent_path())) fs::create_directories(target.parent_path());
  const fs::path tmp = temp_dir_for(target);
  std::error_code ec;
  remove_tree(tmp);
  HEARTH_CHECK(fs::create_directory(tmp, ec), tmp.string(), ": cannot create folder (", ec.message(), ")");
  try {
    write_file_atomic(tmp / kPartialMarker, "");
    fill(tmp);
    fs::remove(tmp / kPartialMarker, ec);
  } catch (...) {
    remove_tree(tmp);
    throw;
  }
  if (!replace) {
    int rc = ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) rc = ::rename(tmp.c_str(), target.c_str());
    if (rc != 0) {
      const int err = errno;
      if (err == EEXIST || err == ENOTEMPTY)
        throw Error(cat(target.string(), ": appeared while it was being written (another run, or made by hand); it was "
                                         "left as it is, and the result is in ",
                        tmp.string()));
      remove_tree(tmp);
      throw Error(cat(target.string(), ": cannot rename temp folder into place (", std::strerror(err), ")"));
    }
    return;
  }
  try {
    fs::path old;
    if (fs::exists(target)) {
      old = fs::path(target.string() + ".old." + std::to_string(::getpid()));
      fs::rename(target, old);
    }
    fs::rename(tmp, target, ec);
    if (ec) {
      if (!old.empty()) fs::rename(old, target);
      throw Error(cat(target.string(), ": cannot rename temp folder into place (", ec.message(), ")"));
    }
    if (!old.empty()) remove_tree(old);
  } catch (...) {
    remove_tree(tmp);
    throw;
  }
}

}  // namespace hearth::io
