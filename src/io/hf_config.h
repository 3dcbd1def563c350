// Hugging Face folder-level JSON that is not model-family specific: reading JSON files with
// clear errors and generation_config.json. (The MLX `quantization` block: nn/quant_config.h.)
// Family configs (hidden sizes, RoPE, ...) live with their family under models/.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/read_file.h"

namespace hearth::io {

/// Parses a JSON file read by io::read_file (regular file, size cap of `kind`, confined to `roots`
/// when given); throws hearth::Error "<path>: invalid JSON (parse error at line L, column C: ...)"
/// without quoting the file's bytes, or read_file's errors.
nlohmann::json read_json(const std::filesystem::path& path, FileKind kind = FileKind::kConfig, const Roots& roots = {});

/// A nlohmann::json exception message made fit for a one-line error: the "[json.exception...]"
/// tag and the quoted input ("; last read: '...'") removed, newlines flattened.
std::string json_error_text(const std::exception& e);

/// generation_config.json (all fields optional; a missing file gives an empty config). Values are
/// checked at load, as the server's request checks would (temperature >= 0, top_p in (0, 1],
/// min_p in [0, 1], top_k >= 0, repetition_penalty > 0, all finite; ids >= 0): a bad one throws
/// hearth::Error "<path>: <field> must be ..., got <value>".
struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;   // eos_token_id: int or list
  std::optional<int64_t> bos_token_id;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
  std::optional<bool> do_sample;
  static GenerationConfig load(const std::filesystem::path& dir);
};

}  // namespace hearth::io
