// Where module weights come from when a model is built: a model folder's io::WeightStore, or an
// in-memory name → tensor map (tests, random init). Not a loader of files itself (see io/weights.h).
#pragma once
#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hearth::io {
class WeightStore;
}

namespace hearth::nn {

/// Target placement of loaded weights. `dtype` applies to floating tensors only (packed
/// quantized words keep their integer type).
struct LoadOptions {
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;
};

/// Tensors by Hugging Face name.
class ParamSource {
 public:
  virtual ~ParamSource() = default;
  virtual bool contains(const std::string& name) const = 0;
  /// The tensor `name` with shape checked against `expected` (empty = unchecked); throws
  /// hearth::Error "<file>: tensor <name> has shape [..], expected [..]" or "...: missing tensor".
  virtual at::Tensor get(const std::string& name, const std::vector<int64_t>& expected = {}) const = 0;
};

/// A ParamSource over a model folder's weights (CPU views over mmaps; placed by the caller).
class WeightStoreSource : public ParamSource {
 public:
  explicit WeightStoreSource(const io::WeightStore& store) : store_(store) {}
  bool contains(const std::string& name) const override;
  at::Tensor get(const std::string& name, const std::vector<int64_t>& expected = {}) const override;

 private:
  const io::WeightStore& store_;
};

/// A ParamSource over an in-memory map; `origin` names it in errors.
class TensorMapSource : public ParamSource {
 public:
  explicit TensorMapSource(std::map<std::string, at::Tensor> tensors, std::string origin = "<memory>")
      : tensors_(std::move(tensors)), origin_(std::move(origin)) {}
  bool contains(const std::string& name) const override { return tensors_.count(name) > 0; }
  at::Tensor get(const std::string& name, const std::vector<int64_t>& expected = {}) const override;
  std::map<std::string, at::Tensor>& tensors() { return tensors_; }

 private:
  std::map<std::string, at::Tensor> tensors_;
  std::string origin_;
};

/// "[2, 3]" for error messages.
std::string shape_str(at::IntArrayRef shape);

/// Moves a loaded tensor to `opts`: floating tensors to opts.dtype, others keep their dtype;
/// always contiguous and owning (never a view over an mmap once on CPU in another dtype).
at::Tensor place(const at::Tensor& t, const LoadOptions& opts);

/// The float dtype a model folder's config.json declares: "torch_dtype" (transformers 4.x) or
/// "dtype" (5.x), at the top level, else in "text_config"; nullopt when config.json is missing or
/// unreadable (the loader reports that) or the value is not "float32" | "bfloat16" | "float16".
std::optional<at::ScalarType> checkpoint_dtype(const std::filesystem::path& model_dir);

/// The dtype when --dtype is not given, as transformers' torch_dtype="auto": on CUDA the
/// checkpoint's declared bfloat16/float16 (float32 when it declares float32 or nothing); on the
/// CPU float32. `model_dir` "" = no checkpoint (float32).
at::ScalarType default_dtype(const at::Device& device, const std::filesystem::path& model_dir);

/// Resolves the CLI's --device/--dtype flags for loading `model_dir` (the one place every verb
/// resolves them): device "" → cuda when available, else cpu; dtype "" → default_dtype(device,
/// model_dir); names "cpu" | "cuda", "float32" | "bfloat16" | "float16".
/// Throws hearth::InvalidArgument naming the flag on an unknown name, cuda without a device, or
/// float16 on the CPU when this libtorch cannot multiply float16 matrices there (1.13; probed).
LoadOptions resolve_placement(const std::string& device, const std::string& dtype,
                              const std::filesystem::path& model_dir);

}  // namespace hearth::nn
