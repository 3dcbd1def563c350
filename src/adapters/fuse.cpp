// Fusing a LoRA adapter into a model folder (fuse.h): merge per module in fp32, requantize
// quantized modules with their own spec (mlx-lm LoRALinear.fuse), write a complete new folder.
// Not runtime mounting (mount.cpp).
#include "adapters/fuse.h"

#include <algorithm>
#include <set>

#include "io/atomic_dir.h"
#include "adapters/full.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "nn/param_source.h"
#include "nn/quant.h"
#include "nn/quant_config.h"

namespace hearth::adapters {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kIndex = "model.safetensors.index.json";

bool is_shard(const fs::path& p) { return p.extension() == ".safetensors" || p.filename() == kIndex; }

struct QuantTriple {
  nn::QuantizedWeight qw;
};

QuantTriple read_quantized(const io::WeightStore& store, const std::string& module,
                           const std::optional<nn::QuantizationConfig>& quant, const std::string& where) {
  std::optional<nn::QuantSpec> spec = quant ? quant->spec_for(module) : std::nullopt;
  HEARTH_CHECK(spec.has_value(), where, ": ", module, " has .scales but config.json's quantization block does not quantize it");
  QuantTriple t;
  t.qw.spec = *spec;
  t.qw.wq = store.get(module + ".weight");
  if (t.qw.wq.scalar_type() != at::kInt) t.qw.wq = t.qw.wq.view(at::kInt);
  t.qw.scales = store.get(module + ".scales");
  t.qw.biases = store.get(module + ".biases");
  HEARTH_CHECK(t.qw.wq.dim() == 2 && t.qw.scales.dim() == 2 &&
                   t.qw.scales.size(1) * spec->group_size == t.qw.in_features() &&
                   t.qw.scales.size(0) == t.qw.out_features() && t.qw.biases.sizes() == t.qw.scales.sizes(),
               where, ": ", module, ": quantized tensors do not agree with bits ", spec->bits, ", group_size ",
               spec->group_size);
  return t;
}

// --dequantize: every quantized module not already replaced becomes a dense weight in its scales'
// dtype, and config.json loses its quantization block.
void dequantize_rest(const io::WeightStore& store, const std::optional<nn::QuantizationConfig>& quant,
                     const std::string& where, json& config, std::map<std::string, at::Tensor>& replaced,
                     std::set<std::string>& dropped) {
  for (const std::string& name : store.names()) {
    const std::string suffix = ".scales";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string module = name.substr(0, name.size() - suffix.size());
    if (replaced.count(module + ".weight") || !store.contains(module + ".weight")) continue;
    QuantTriple q = read_quantized(store, module, quant, where);
    replaced[module + ".weight"] = nn::dequantize(q.qw);  // in the scales' dtype
    dropped.insert({module + ".scales", module + ".biases"});
  }
  config.erase("quantization");
  config.erase("quantization_config");
}

// Writes the base folder with `replaced` tensors instead of the base's and `dropped` ones left out:
// shards keep their names and metadata, the index is rewritten, every other top-level regular file
// is copied (config.json as `config`), atomically under a temp name.
void write_model_folder(const fs::path& model_dir, const io::WeightStore& store, const json& config,
                        const std::map<std::string, at::Tensor>& replaced, const std::set<std::string>& dropped,
                        const fs::path& out_dir, const FuseOptions& opts) {
  auto check = [&] {
    if (opts.between_tensors) opts.between_tensors();
  };
  io::write_dir_atomic(out_dir, /*replace=*/false, [&](const fs::path& tmp) {
    json weight_map = json::object();
    int64_t total = 0;
    for (const auto& file : store.files()) {
      std::map<std::string, at::Tensor> tensors;
      std::map<std::string, io::DType> labels;
      for (const auto& info : file->tensors()) {
        check();
        if (dropped.count(info.name)) continue;
        auto it = replaced.find(info.name);
        at::Tensor t = it != replaced.end() ? it->second : file->tensor(info.name);
        if (info.dtype == io::DType::U32 && t.scalar_type() == at::kInt) labels[info.name] = io::DType::U32;
        tensors[info.name] = t;
        weight_map[info.name] = file->path().filename().string();
        total += t.numel() * t.element_size();
      }
      check();
      io::save_safetensors(tmp / file->path().filename(), tensors, file->metadata(), labels);
    }
    if (fs::exists(model_dir / kIndex)) {
      json index = io::read_json(model_dir / kIndex);
      index["weight_map"] = weight_map;
      if (!index.contains("metadata") || !index["metadata"].is_object()) index["metadata"] = json::object();
      index["metadata"]["total_size"] = total;
      io::write_file_atomic(tmp / kIndex, index.dump(2) + "\n");
    }
    for (const auto& e : fs::directory_iterator(model_dir)) {
      if (!e.is_regular_file() || is_shard(e.path())) continue;
      if (e.path().filename() == "config.json") io::write_file_atomic(tmp / "config.json", config.dump(2) + "\n");
      else fs::copy_file(e.path(), tmp / e.path().filename());
    }
    check();
  });
}

}  // namespace

void fuse_model(const fs::path& model_dir, const Adapter& adapter, const fs::path& out_dir, const FuseOptions& opts) {
  HEARTH_CHECK(!fs::exists(out_dir), out_dir.string(), ": already exists (fuse writes a new folder)");
  HEARTH_CHECK(!adapter.modules.empty(), "adapter '", adapter.id, "': has no modules");
  const fs::path cfg_path = model_dir / "config.json";
  json config = io::read_json(cfg_path);
  const std::optional<nn::QuantizationConfig> quant = nn::QuantizationConfig::from_config(config, cfg_path.string());
  const io::WeightStore store = io::WeightStore::open(model_dir);
  const std::string where = model_dir.string();

  // Replacement tensors by name (merged weights, requantized triples, dequantized weights), and
  // names to drop (scales/biases of dequantized modules).
  std::map<std::string, at::Tensor> replaced;
  std::set<std::string> dropped;
  const std::vector<std::string> stored = store.names();
  std::vector<std::string> stored_modules;  // "<module>.weight" names without the suffix
  for (const auto& n : stored)
    if (n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0) stored_modules.push_back(n.substr(0, n.size() - 7));
  std::sort(stored_modules.begin(), stored_modules.end());  // resolve_module_path searches a sorted list
  std::set<std::string> fused;
  for (const auto& [adapter_module, m] : adapter.modules) {
    if (opts.between_tensors) opts.between_tensors();
    const std::string who = cat("adapter '", adapter.id, "': ", adapter_module);
    // The base's own name of the module (an adapter of another wrapping of it is accepted).
    const std::string module = resolve_module_path(adapter_module, stored_modules).value_or(adapter_module);
    HEARTH_CHECK(fused.insert(module).second, who, ": names ", module, " as another of its entries does");
    const bool quantized = store.contains(module + ".scales");
    if (!store.contains(module + ".weight")) {
      HEARTH_CHECK(module != "lm_head" && !store.contains("model.embed_tokens.weight"), who,
                   ": no weight in ", where, " (lm_head is tied to model.embed_tokens; fusing a tied head is unsupported)");
      throw Error(cat(who, ": no weight ", module, ".weight in ", where));
    }
    QuantTriple q;
    at::Tensor w32;
    at::ScalarType out_dtype;
    if (quantized) {
      q = read_quantized(store, module, quant, where);
      w32 = nn::dequantize(q.qw, at::kFloat);
      out_dtype = q.qw.scales.scalar_type();
    } else {
      at::Tensor w = store.get(module + ".weight");
      HEARTH_CHECK(w.dim() == 2 && at::isFloatingType(w.scalar_type()), who, ": weight is not a 2-D float tensor");
      w32 = w.to(at::kFloat);
      out_dtype = w.scalar_type();
    }
    const int64_t out = w32.size(0), in = w32.size(1), r = m.a.size(0);
    HEARTH_CHECK(m.a.dim() == 2 && m.b.dim() == 2 && m.a.size(1) == in && m.b.size(0) == out && m.b.size(1) == r,
                 who, ": A ", nn::shape_str(m.a.sizes()), " / B ", nn::shape_str(m.b.sizes()), " do not fit the [",
                 out, ", ", in, "] weight");
    // W' = W + scale · B A, in fp32, cast once.
    at::Tensor merged = w32 + at::mm(m.b.detach().to(at::kFloat), m.a.detach().to(at::kFloat)) * m.scale;
    merged = merged.to(out_dtype);
    if (quantized && !opts.dequantize) {
      nn::QuantizedWeight nq = nn::quantize(merged, q.qw.spec);
      replaced[module + ".weight"] = nq.wq;
      replaced[module + ".scales"] = nq.scales.to(q.qw.scales.scalar_type());
      replaced[module + ".biases"] = nq.biases.to(q.qw.biases.scalar_type());
    } else {
      replaced[module + ".weight"] = merged.contiguous();
      if (quantized) dropped.insert({module + ".scales", module + ".biases"});
    }
  }
  if (opts.dequantize) dequantize_rest(store, quant, where, config, replaced, dropped);
  write_model_folder(model_dir, store, config, replaced, dropped, out_dir, opts);
}

void fuse_full_model(const fs::path& model_dir, const fs::path& finetune_dir, const fs::path& out_dir,
                     const FuseOptions& opts) {
  HEARTH_CHECK(!fs::exists(out_dir), out_dir.string(), ": already exists (fuse writes a new folder)");
  const fs::path cfg_path = model_dir / "config.json";
  json config = io::read_json(cfg_path);
  const std::optional<nn::QuantizationConfig> quant = nn::QuantizationConfig::from_config(config, cfg_path.string());
  const io::WeightStore store = io::WeightStore::open(model_dir);
  WeightEdits e = full_finetune_edits(store, quant, load_full_finetune(finetune_dir), opts.dequantize,
                                      "full fine-tune " + finetune_dir.string());
  if (opts.dequantize) dequantize_rest(store, quant, model_dir.string(), config, e.replaced, e.dropped);
  write_model_folder(model_dir, store, config, e.replaced, e.dropped, out_dir, opts);
}

}  // namespace hearth::adapters
