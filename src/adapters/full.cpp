// Full fine-tunes over a base model (full.h): reading adapters.safetensors of fine_tune_type
// "full", the per-tensor edits (cast, or requantize with the module's spec), and a model loaded
// through them. Not writing folders (fuse.cpp).
#include "adapters/full.h"

#include <set>

#include "adapters/adapter.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "models/registry.h"
#include "nn/quant.h"
#include "nn/quant_config.h"

namespace hearth::adapters {
namespace fs = std::filesystem;

namespace {
constexpr const char* kWeights = "adapters.safetensors";
constexpr const char* kConfig = "adapter_config.json";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

bool is_full_finetune(const fs::path& dir) {
  const fs::path cfg = dir / kConfig;
  std::error_code ec;
  if (!fs::is_regular_file(cfg, ec)) return false;
  const nlohmann::json j = io::read_json(cfg);
  if (!j.is_object()) return false;
  auto it = j.find("fine_tune_type");
  return it != j.end() && it->is_string() && it->get<std::string>() == "full";
}

std::map<std::string, at::Tensor> load_full_finetune(const fs::path& dir) {
  HEARTH_CHECK(is_full_finetune(dir), (dir / kConfig).string(), ": not a full fine-tune (fine_tune_type must be \"full\")");
  const fs::path file = dir / kWeights;
  HEARTH_CHECK_T(NotFound, fs::exists(file), file.string(), ": missing (a full fine-tune keeps its tensors there)");
  auto st = io::SafetensorsFile::open(file);
  std::map<std::string, at::Tensor> out;
  for (const auto& info : st->tensors()) {
    at::Tensor t = st->tensor(info.name);
    HEARTH_CHECK(at::isFloatingType(t.scalar_type()), file.string(), ": tensor ", info.name, " is not floating point");
    out[info.name] = t.clone();
  }
  HEARTH_CHECK(!out.empty(), file.string(), ": holds no tensors");
  return out;
}

WeightEdits full_finetune_edits(const io::WeightStore& base, const std::optional<nn::QuantizationConfig>& quant,
                                const std::map<std::string, at::Tensor>& trained, bool dequantize,
                                const std::string& who) {
  WeightEdits e;
  const std::string where = base.dir().string();
  const std::vector<std::string> stored = base.names();
  std::set<std::string> seen;
  for (const auto& [trained_name, t] : trained) {
    // The base's own name (a fine-tune of another wrapping of the same checkpoint is accepted).
    const std::string name = resolve_module_path(trained_name, stored).value_or(trained_name);
    HEARTH_CHECK(seen.insert(name).second, who, ": tensor ", trained_name, " names ", name, " as another tensor does");
    const std::string module = ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : "";
    const bool quantized = !module.empty() && base.contains(module + ".scales");
    HEARTH_CHECK(base.contains(name), who, ": tensor ", name, " is not in the base model ", where);
    if (!quantized) {
      const at::Tensor b = base.get(name);
      HEARTH_CHECK(b.sizes() == t.sizes(), who, ": tensor ", name, " has shape ", nn::shape_str(t.sizes()),
                   ", the base model's is ", nn::shape_str(b.sizes()), " (", where, ")");
      HEARTH_CHECK(at::isFloatingType(b.scalar_type()), who, ": base tensor ", name, " is not floating point");
      e.replaced[name] = t.to(b.scalar_type()).contiguous();
      continue;
    }
    std::optional<nn::QuantSpec> spec = quant ? quant->spec_for(module) : std::nullopt;
    HEARTH_CHECK(spec.has_value(), where, ": ", module,
                 " has .scales but config.json's quantization block does not quantize it");
    const at::Tensor scales = base.get(module + ".scales");
    const int64_t out = scales.size(0), in = scales.size(1) * spec->group_size;
    HEARTH_CHECK(t.dim() == 2 && t.size(0) == out && t.size(1) == in, who, ": tensor ", name, " has shape ",
                 nn::shape_str(t.sizes()), ", the base model's quantized module is [", out, ", ", in, "] (", where, ")");
    const at::Tensor w = t.to(scales.scalar_type()).contiguous();
    if (dequantize) {
      e.replaced[name] = w;
      e.dropped.insert({module + ".scales", module + ".biases"});
    } else {
      nn::QuantizedWeight q = nn::quantize(w, *spec);
      e.replaced[name] = q.wq;
      e.replaced[module + ".scales"] = q.scales.to(scales.scalar_type());
      e.replaced[module + ".biases"] = q.biases.to(base.get(module + ".biases").scalar_type());
    }
  }
  return e;
}

bool EditedSource::contains(const std::string& name) const {
  if (edits_.replaced.count(name)) return true;
  return !edits_.dropped.count(name) && base_.contains(name);
}

at::Tensor EditedSource::get(const std::string& name, const std::vector<int64_t>& expected) const {
  auto it = edits_.replaced.find(name);
  if (it == edits_.replaced.end()) {
    HEARTH_CHECK(!edits_.dropped.count(name), origin_, ": missing tensor ", name);
    return base_.get(name, expected);
  }
  if (!expected.empty())
    HEARTH_CHECK(it->second.sizes().vec() == expected, origin_, ": tensor ", name, " has shape ",
                 nn::shape_str(it->second.sizes()), ", expected ", nn::shape_str(expected));
  return it->second;
}

std::unique_ptr<models::Model> load_model_with_full_finetune(const fs::path& model_dir, const fs::path& finetune_dir,
                                                             const nn::LoadOptions& opts) {
  const fs::path config_path = model_dir / "config.json";
  const nlohmann::json config = io::read_json(config_path);
  const auto quant = nn::QuantizationConfig::from_config(config, config_path.string());
  const io::WeightStore store = io::WeightStore::open(model_dir);
  const WeightEdits edits = full_finetune_edits(store, quant, load_full_finetune(finetune_dir), /*dequantize=*/false,
                                                "full fine-tune " + finetune_dir.string());
  nn::WeightStoreSource base(store);
  EditedSource source(base, edits, finetune_dir.string() + " over " + model_dir.string());
  return models::build_model({config, config_path.string(), source, quant, opts});
}

}  // namespace hearth::adapters
