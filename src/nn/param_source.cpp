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

bool WeightStoreSource::contains(const std::string& name) const { return store_.contains(name); }

at::Tensor WeightStoreSource::get(const std::string& name, const std::vector<int64_t>& expected) const {
  return expected.empty() ? store_.get(name) : store_.get(name, expected);
}

at::Tensor TensorMapSource::get(const std::string& name, const std::vector<int64_t>& expected) const {
  auto it = tensors_.find(name);
  HEARTH_CHECK(it != tensors_.end(), origin_, ": missing tensor ", name);
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
