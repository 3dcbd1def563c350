// Helpers for io tests: a self-deleting temp folder and a raw safetensors writer that can produce
// deliberately corrupt files. Not used by library code.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "io/atomic_file.h"

namespace hearth::testing {

/// A fresh folder under the system temp dir, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("hearth_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    hearth::io::remove_tree(path_);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// Writes `bytes` to `path` as-is.
inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A safetensors file image: 8-byte little-endian `header_len` (default: the header's size),
/// then `header`, then `data`.
inline std::string safetensors_bytes(const std::string& header, const std::string& data,
                                     long long header_len = -1) {
  unsigned long long n = header_len < 0 ? header.size() : static_cast<unsigned long long>(header_len);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

}  // namespace hearth::testing
