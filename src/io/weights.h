// A model folder's weights: one model.safetensors, or shards listed in
// model.safetensors.index.json (or, lacking an index, every *.safetensors in the folder).
// Name lookup only; what the names mean is the model family's business.
#pragma once
#include <ATen/ATen.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace hearth::io {

/// All tensors of a model folder, by Hugging Face name. Tensors are CPU views over mmaps.
class WeightStore {
 public:
  /// Opens every shard of `dir`: model.safetensors if present, else the shards named by
  /// model.safetensors.index.json (`weight_map`), else every *.safetensors. Throws hearth::Error
  /// (one line naming the path) if the folder or weights are missing, a shard named by the index is
  /// missing or lacks a tensor mapped to it, or a tensor name appears in two files.
  static WeightStore open(const std::filesystem::path& dir);

  bool contains(const std::string& name) const;
  /// The tensor `name`; throws hearth::Error "<dir>: missing tensor <name>" if absent.
  at::Tensor get(const std::string& name) const;
  /// Like get(), and checks the shape: "<file>: tensor <name> has shape [..], expected [..]".
  at::Tensor get(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  /// All names, sorted.
  std::vector<std::string> names() const;
  /// Total bytes of tensor data across shards.
  int64_t total_bytes() const;
  /// The shard file that holds `name`.
  const std::filesystem::path& file_of(const std::string& name) const;
  /// Header entry (dtype, shape, byte range) of `name`; throws like get().
  const TensorInfo& info(const std::string& name) const;
  /// The opened shard files, in load order.
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  /// The model folder.
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;
};

}  // namespace hearth::io
