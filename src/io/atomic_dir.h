// Writing a whole folder atomically: fill a temp folder beside the target, then rename it into
// place. Not a general file API (io/atomic_file.h writes single files).
#pragma once
#include <unistd.h>

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

/// Calls `fill(tmp)` on a fresh temp folder temp_dir_for(dir) and renames it to `dir`. When
/// `replace` and `dir` exists, the old folder is moved aside and removed after the rename; when
/// not `replace`, an existing `dir` is an error. A missing parent folder is created. On exception
/// (from `fill` too) the temp folder is removed and the exception rethrown. Throws hearth::Error
/// naming the folder when it cannot be created or renamed.
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
    fill(tmp);
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
