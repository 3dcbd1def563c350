// Where module weights come from when a model is built: a model folder's io::WeightStore, or an
// in-memory name → tensor map (tests, random init). Not a loader of files itself (see io/weights.h).
#pragma once
#include <ATen/ATen.h>

#include <map>
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

/// Resolves the CLI's --device/--dtype flags: device "" → cuda when available, else cpu; dtype
/// "" → bf16 on cuda, fp32 on cpu; names "cpu" | "cuda", "float32" | "bfloat16" | "float16".
/// Throws hearth::InvalidArgument naming the flag on an unknown name, cuda without a device, or
/// float16 on the CPU when this libtorch cannot multiply float16 matrices there (1.13; probed).
LoadOptions resolve_placement(const std::string& device, const std::string& dtype);

}  // namespace hearth::nn
