// ParamSource implementations: over io::WeightStore (model folders) and over in-memory maps.
#include "nn/param_source.h"

#include <nlohmann/json.hpp>

#include <sstream>

#include "core/error.h"
#include "core/torch_compat.h"
#include "io/hf_config.h"
#include "io/weights.h"

namespace hearth::nn {

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

namespace {

// Integer (and bool) tensors are legal only where the format stores codes: MLX packed quantized
// weights, "<module>.weight" as U32 (or I32) beside "<module>.scales". Anywhere else they would be
// converted numerically into garbage weights (or fail inside torch with no file named).
template <typename Contains>
void check_dtype(const std::string& name, at::ScalarType type, const char* stored, const std::string& origin,
                 Contains contains) {
  if (at::isFloatingType(type)) return;
  const std::string suffix = ".weight";
  const bool packed = name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
                      contains(name.substr(0, name.size() - suffix.size()) + ".scales");
  HEARTH_CHECK(packed && type == at::kInt, origin, ": tensor ", name, " is stored as ", stored,
               packed ? "; MLX packed weights must be U32" : "",
               packed ? "" : ", not a floating-point type; integer dtypes are only read as MLX packed weights "
                             "(a .weight beside .scales)");
}

}  // namespace

bool WeightStoreSource::contains(const std::string& name) const { return store_.contains(name); }

at::Tensor WeightStoreSource::get(const std::string& name, const std::vector<int64_t>& expected) const {
  if (store_.contains(name)) {
    const io::TensorInfo& info = store_.info(name);
    check_dtype(name, io::to_scalar_type(info.dtype), io::dtype_name(info.dtype), store_.file_of(name).string(),
                [&](const std::string& n) { return store_.contains(n); });
  }
  return expected.empty() ? store_.get(name) : store_.get(name, expected);
}

at::Tensor TensorMapSource::get(const std::string& name, const std::vector<int64_t>& expected) const {
  auto it = tensors_.find(name);
  HEARTH_CHECK(it != tensors_.end(), origin_, ": missing tensor ", name);
  const std::string type_name = c10::toString(it->second.scalar_type());
  check_dtype(name, it->second.scalar_type(), type_name.c_str(), origin_,
              [&](const std::string& n) { return tensors_.count(n) > 0; });
  if (!expected.empty())
    HEARTH_CHECK(it->second.sizes().vec() == expected, origin_, ": tensor ", name, " has shape ",
                 shape_str(it->second.sizes()), ", expected ", shape_str(expected));
  return it->second;
}

at::Tensor place(const at::Tensor& t, const LoadOptions& opts) {
  at::ScalarType dtype = at::isFloatingType(t.scalar_type()) ? opts.dtype : t.scalar_type();
  at::Tensor out = t.to(opts.device, dtype).contiguous();
  // A CPU tensor in its source dtype would still alias the file mapping: own it.
  if (out.data_ptr() == t.data_ptr()) out = out.clone();
  return out;
}

namespace {
// Whether this libtorch multiplies float16 matrices on the CPU (the models' Linear and attention
// matmuls). Probed once, not assumed from a version: libtorch 1.13 throws "addmm_impl_cpu_" not
// implemented for 'Half'; PyTorch 2.x has CPU half kernels.
bool cpu_half_matmul_works() {
  static const bool ok = [] {
    try {
      const at::Tensor x = at::ones({2, 4}, at::kHalf), w = at::ones({3, 4}, at::kHalf), b = at::ones({3}, at::kHalf);
      (void)at::linear(x, w, b);
      (void)at::matmul(x.unsqueeze(0), x.t().unsqueeze(0));
      return true;
    } catch (const c10::Error&) {
      return false;
    }
  }();
  return ok;
}
}  // namespace

std::optional<at::ScalarType> checkpoint_dtype(const std::filesystem::path& model_dir) {
  std::error_code ec;
  const std::filesystem::path path = model_dir / "config.json";
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  nlohmann::json cfg;
  try {
    cfg = io::read_json(path);
  } catch (const std::exception&) {
    return std::nullopt;  // load_model names the problem
  }
  for (const nlohmann::json* c : {&cfg, cfg.is_object() && cfg.contains("text_config") ? &cfg["text_config"] : nullptr}) {
    if (!c || !c->is_object()) continue;
    for (const char* key : {"torch_dtype", "dtype"}) {
      auto it = c->find(key);
      if (it == c->end() || !it->is_string()) continue;
      const std::string v = it->get<std::string>();
      if (v == "bfloat16") return at::kBFloat16;
      if (v == "float16") return at::kHalf;
      if (v == "float32") return at::kFloat;
    }
  }
  return std::nullopt;
}

at::ScalarType default_dtype(const at::Device& device, const std::filesystem::path& model_dir) {
  if (!device.is_cuda() || model_dir.empty()) return at::kFloat;
  return checkpoint_dtype(model_dir).value_or(at::kFloat);
}

LoadOptions resolve_placement(const std::string& device, const std::string& dtype,
                              const std::filesystem::path& model_dir) {
  LoadOptions where;
  if (device.empty()) {
    where.device = compat::cuda_available() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  } else if (device == "cpu") {
    where.device = at::kCPU;
  } else if (device == "cuda") {
    HEARTH_CHECK_T(InvalidArgument, compat::cuda_available(), "--device cuda: no CUDA device in this build/machine");
    where.device = at::Device(at::kCUDA, 0);
  } else {
    throw InvalidArgument(cat("--device: '", device, "' is not cpu or cuda"));
  }
  if (dtype.empty()) where.dtype = default_dtype(where.device, model_dir);
  else if (dtype == "float32") where.dtype = at::kFloat;
  else if (dtype == "bfloat16") where.dtype = at::kBFloat16;
  else if (dtype == "float16") where.dtype = at::kHalf;
  else throw InvalidArgument(cat("--dtype: '", dtype, "' is not float32, bfloat16 or float16"));
  HEARTH_CHECK_T(InvalidArgument, !(where.dtype == at::kHalf && where.device.is_cpu() && !cpu_half_matmul_works()),
                 "--dtype float16: this libtorch has no float16 matrix multiply on the CPU; use --dtype bfloat16 or "
                 "float32 on the CPU (float16 works on CUDA)");
  return where;
}

}  // namespace hearth::nn
