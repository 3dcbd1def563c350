// `hearth info --model DIR`: summarizes a model folder from config.json and safetensors headers
// only (architecture, sizes, parameter count, dtypes, quantization, files). Loads no tensor data;
// validates config.json exactly as `hearth generate` does (models::check_config).
#include <cstdio>
#include <iostream>

#include "cli/verb.h"
#include "core/error.h"
#include "io/hf_config.h"
#include "io/weights.h"
#include "models/registry.h"
#include "nn/quant_config.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1000 && u < 4) v /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string human_count(uint64_t n) {
  char buf[32];
  if (n >= 1'000'000'000)
    std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else if (n >= 1'000'000)
    std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n));
  return buf;
}

// A config field from the top level or, for multimodal wrappers, from text_config.
std::string field(const json& c, const char* key) {
  for (const json* j : {&c, c.contains("text_config") ? &c["text_config"] : nullptr}) {
    if (!j || !j->is_object()) continue;
    auto it = j->find(key);
    if (it != j->end() && !it->is_null()) return it->is_string() ? it->get<std::string>() : it->dump();
  }
  return "?";
}

int run_info(const fs::path& dir) {
  using namespace hearth;
  std::error_code ec;
  HEARTH_CHECK_T(InvalidArgument, !fs::exists(dir, ec) || fs::is_directory(dir, ec), dir.string(),
                 ": not a folder (info reads a model folder)");
  HEARTH_CHECK_T(NotFound, fs::is_directory(dir, ec), dir.string(), ": model folder not found");
  const fs::path cfg_path = dir / "config.json";
  const json config = io::read_json(cfg_path);
  HEARTH_CHECK(config.is_object(), cfg_path.string(), ": not a JSON object");
  models::check_config(config, cfg_path.string());  // what generate would refuse, info refuses too
  const auto quant = nn::QuantizationConfig::from_config(config, cfg_path.string());
  const io::WeightStore ws = io::WeightStore::open(dir);

  std::string arch = "?";
  if (auto it = config.find("architectures"); it != config.end() && it->is_array() && !it->empty() &&
                                              (*it)[0].is_string())
    arch = (*it)[0].get<std::string>();

  // Parameters: packed quantized weights count as their logical elements (words * 32 / bits per
  // row); their scales/biases are bookkeeping, not parameters.
  uint64_t params = 0;
  std::map<std::string, int> dtypes;
  for (const auto& name : ws.names()) {
    const io::TensorInfo& t = ws.info(name);
    ++dtypes[io::dtype_name(t.dtype)];
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    auto module_of = [&](size_t suffix) { return name.substr(0, name.size() - suffix); };
    if (ends_with(".scales") || ends_with(".biases")) {
      const std::string module = module_of(7);
      if (ws.contains(module + ".weight") && ws.info(module + ".weight").dtype == io::DType::U32) continue;
    }
    if (ends_with(".weight") && t.dtype == io::DType::U32 && t.shape.size() >= 2 &&
        ws.contains(module_of(7) + ".scales")) {
      std::optional<nn::QuantSpec> spec = quant ? quant->spec_for(module_of(7)) : std::nullopt;
      HEARTH_CHECK(spec.has_value(), cfg_path.string(), ": tensor ", name,
                   " is quantized but config.json has no quantization spec for it");
      numel = numel * 32 / static_cast<uint64_t>(spec->bits);
    }
    params += numel;
  }

  std::cout << "model:         " << dir.string() << "\n"
            << "model_type:    " << field(config, "model_type") << "\n"
            << "architecture:  " << arch << "\n"
            << "layers:        " << field(config, "num_hidden_layers") << "\n"
            << "hidden size:   " << field(config, "hidden_size") << "\n"
            << "heads:         " << field(config, "num_attention_heads") << " (KV heads "
            << field(config, "num_key_value_heads") << ")\n"
            << "vocab:         " << field(config, "vocab_size") << "\n"
            << "parameters:    " << human_count(params) << " (" << params << ")\n"
            << "tensors:       " << ws.names().size() << "\n"
            << "dtypes:        ";
  bool first = true;
  for (const auto& [d, n] : dtypes) std::cout << (first ? "" : ", ") << d << " x" << n, first = false;
  std::cout << "\nquantization:  ";
  if (quant)
    std::cout << quant->default_spec.bits << "-bit affine, group " << quant->default_spec.group_size << ", "
              << quant->overrides.size() << " override(s)\n";
  else
    std::cout << "none\n";
  uint64_t total = 0;
  for (const auto& f : ws.files()) total += f->file_size();
  std::cout << "files:         " << ws.files().size() << " (" << human_bytes(total) << ")\n";
  for (const auto& f : ws.files())
    std::cout << "  " << f->path().filename().string() << "  " << human_bytes(f->file_size()) << "  "
              << f->tensors().size() << " tensors\n";
  return 0;
}

std::function<int()> setup_info(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  app.add_option("--model,-m", *dir, "Model folder (config.json + *.safetensors)")->required();
  return [dir] { return run_info(*dir); };
}

}  // namespace
HEARTH_REGISTER_VERB(info, "info", "Summarize a model folder (config + safetensors headers)", setup_info);
