// libFuzzer target for the safetensors header validator: either a bare header (parse_safetensors_header)
// or a whole in-memory file (parse_safetensors_bytes: length prefix + header + data), chosen by the
// first input byte. Besides "no crash", it checks the validator's promises on every accepted input.
// Not a test of mmap or tensor views (tests/io/safetensors_test.cpp covers those).
#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

// Accepted entries must be in bounds, sized dtype x shape, and pairwise non-overlapping.
void check_promises(const std::vector<hearth::io::TensorInfo>& ts, uint64_t data_size) {
  for (const auto& t : ts) {
    if (t.begin > t.end || t.end > data_size) __builtin_trap();
    unsigned __int128 n = static_cast<unsigned __int128>(hearth::io::dtype_size(t.dtype));
    for (int64_t d : t.shape) {
      if (d < 0) __builtin_trap();
      n *= static_cast<uint64_t>(d);
      if (n > data_size) break;
    }
    if (n != t.end - t.begin) __builtin_trap();
  }
  for (size_t i = 0; i < ts.size(); ++i)
    for (size_t j = i + 1; j < ts.size() && j < i + 64; ++j) {
      const auto &a = ts[i], &b = ts[j];
      if (a.end > a.begin && b.end > b.begin && a.begin < b.end && b.begin < a.end) __builtin_trap();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::map<std::string, std::string> meta;
  try {
    if (mode & 1) {
      uint64_t data_offset = 0;
      auto ts = hearth::io::parse_safetensors_bytes(rest, "fuzz", &meta, &data_offset);
      if (data_offset < 8 || data_offset > rest.size()) __builtin_trap();
      check_promises(ts, rest.size() - data_offset);
    } else {
      // Header only; the data size comes from the mode byte so both in- and out-of-bounds occur.
      const uint64_t data_size = (mode >> 1) * 4ull;
      check_promises(hearth::io::parse_safetensors_header(rest, data_size, "fuzz", &meta), data_size);
    }
  } catch (const hearth::Error& e) {
    // Errors are one line that starts with the origin.
    if (std::strchr(e.what(), '\n') != nullptr || std::string_view(e.what()).find("fuzz: ") != 0) __builtin_trap();
  }
  return 0;
}
