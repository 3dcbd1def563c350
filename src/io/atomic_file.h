// Atomic file writes: write to "<path>.tmp.<pid>" in the same folder, fsync, rename over `path`.
// A crash or error leaves the old file intact. Not for appending logs.
#pragma once
#include <filesystem>
#include <functional>
#include <ostream>
#include <string_view>

namespace hearth::io {

/// Writes `bytes` to `path` atomically; throws hearth::Error naming `path` on failure.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);

/// Calls `fill(stream)` on a temp file, then renames it over `path`; on exception, removes the
/// temp file and rethrows.
void write_file_atomic(const std::filesystem::path& path, const std::function<void(std::ostream&)>& fill);

/// Removes the temporaries "<name>.tmp.<pid>" (files or folders, directly in `dir`) that a
/// process which no longer runs left behind (a kill between writing and renaming); those of this
/// process and of running ones stay. Returns the number removed (0 when `dir` is missing);
/// errors are not thrown (cleanup).
int64_t remove_stale_temporaries(const std::filesystem::path& dir) noexcept;

/// Reads a whole file; throws hearth::Error "<path>: cannot read (...)" when missing/unreadable.
std::string read_file(const std::filesystem::path& path);

/// Removes `path` and everything under it (no error if it does not exist); returns the number of
/// entries removed, or -1 on failure (errors are not thrown: cleanup paths call this).
/// Use this instead of std::filesystem's remove_all: PyTorch 2.x wheels export their own copy of
/// that symbol from libtorch.so, and calls resolve to it and crash (seen with torch 2.11).
int64_t remove_tree(const std::filesystem::path& path) noexcept;

}  // namespace hearth::io
