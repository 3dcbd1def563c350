// safetensors reading (mmap, fully validated header) and writing (atomic). Not a model loader:
// see weights.h for folders, shards and name lookup.
// Format: https://github.com/huggingface/safetensors (8-byte LE header length, JSON header, data).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "io/read_file.h"

namespace hearth::io {

/// Element types safetensors files carry that Hearth reads.
enum class DType { F32, F16, BF16, I8, U8, I16, I32, U32, I64, BOOL, F64 };

/// "F32", "BF16", ... as written in safetensors headers.
const char* dtype_name(DType d);
/// Bytes per element.
int64_t dtype_size(DType d);
/// The at::ScalarType for a DType (U32 maps to kInt: the bits are reinterpreted, never converted).
at::ScalarType to_scalar_type(DType d);
/// The DType for an at::ScalarType; throws hearth::Error for types safetensors cannot store.
DType from_scalar_type(at::ScalarType t);

/// One tensor entry of a header: byte range [begin, end) relative to the data section.
struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

/// Parses and validates a safetensors header as the reference reader (the safetensors crate's
/// SafeTensors::read_metadata and Metadata::validate) does. `data_size` is the byte length of the
/// data section. Checks: JSON well-formed object (JSON whitespace may pad it, NUL bytes may not);
/// each entry has dtype/shape/data_offsets of the right types; known dtype; non-negative shape;
/// dtype_size * prod(shape) == end - begin; the entries, sorted by offsets, cover the data section
/// exactly: from 0, no gap, no overlap, no bytes after the last. Throws hearth::Error naming
/// `origin` and the entry.
std::vector<TensorInfo> parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                                 const std::string& origin,
                                                 std::map<std::string, std::string>* metadata = nullptr);

/// Validates a whole safetensors file held in memory (`bytes`: 8-byte LE header length, header,
/// data): the length must fit in the file and be at most 100 MB, then the header is parsed as by
/// parse_safetensors_header with the rest of `bytes` as the data section. Sets `*data_offset`
/// (when given) to the byte offset of the data section. Throws hearth::Error naming `origin`.
std::vector<TensorInfo> parse_safetensors_bytes(std::string_view bytes, const std::string& origin,
                                                std::map<std::string, std::string>* metadata = nullptr,
                                                uint64_t* data_offset = nullptr);

/// Largest header Hearth accepts (the Python reader's limit): 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

/// A memory-mapped, validated safetensors file. Tensors returned are CPU views over the mapping
/// (zero-copy) that keep the mapping alive; clone them before writing.
class SafetensorsFile {
 public:
  /// Opens (io::OpenFile: a regular file, inside `roots` when given) and validates `path`; throws
  /// hearth::Error ("<path>: <problem>") on any defect, including a header length beyond the file
  /// or over 100 MB. Reads only the header: tensor bytes are touched when tensor() is used.
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path, const Roots& roots = {});
  ~SafetensorsFile();

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Size of the whole file in bytes.
  uint64_t file_size() const { return map_size_; }
  /// Bytes of tensor data (sum of end - begin over entries).
  uint64_t data_bytes() const;
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  /// The named tensor as a CPU view over the file, shape as in the header. Throws if absent.
  at::Tensor tensor(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  uint64_t data_offset_ = 0;
  std::weak_ptr<SafetensorsFile> self_;
};

/// Writes `tensors` (any device; copied to CPU, contiguous) to `path` atomically (temp + rename),
/// names sorted, with optional string `metadata` (e.g. {"format": "mlx"}). The header is padded
/// with spaces to a multiple of 8 bytes, as the Python writer does. `stored_dtypes` overrides the
/// dtype written for a tensor when only the label differs (a kInt tensor written as U32 — MLX's
/// packed quantized weights); any other mismatch throws hearth::Error.
void save_safetensors(const std::filesystem::path& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      const std::map<std::string, DType>& stored_dtypes = {});

/// Parses a dtype name as written in headers ("F32", "BF16", ...); nullopt when unknown.
std::optional<DType> parse_dtype_name(std::string_view name);

}  // namespace hearth::io
