// The family table (model_type → factory) and model-folder loading.
#include "models/registry.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "io/weights.h"
#include "models/llama/llama.h"

namespace hearth::models {

namespace {
// One line per family.
const std::map<std::string, Factory>& families() {
  static const std::map<std::string, Factory> table = {
      {"llama", llama::create},
      {"mistral", llama::create},
      {"qwen2", llama::create},
      {"qwen3", llama::create},
  };
  return table;
}
}  // namespace

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const auto& [name, f] : families()) out.push_back(name);
  return out;
}

std::unique_ptr<Model> build_model(const BuildArgs& args) {
  std::string type;
  if (auto it = args.config.find("model_type"); it != args.config.end() && it->is_string()) type = *it;
  auto f = families().find(type);
  if (f == families().end()) {
    std::string list;
    for (const auto& name : supported_model_types()) list += (list.empty() ? "" : ", ") + name;
    throw Error(cat(args.origin, ": unsupported model_type '", type, "' (supported: ", list, ")"));
  }
  return f->second(args);
}

std::unique_ptr<Model> load_model(const std::filesystem::path& dir, const nn::LoadOptions& opts) {
  const auto config_path = dir / "config.json";
  nlohmann::json config = io::read_json(config_path);
  io::WeightStore store = io::WeightStore::open(dir);
  nn::WeightStoreSource source(store);
  return build_model({config, config_path.string(), source,
                      io::QuantizationConfig::from_config(config, config_path.string()), opts});
}

}  // namespace hearth::models
