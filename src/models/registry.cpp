// The family table (model_type → factory) and model-folder loading.
#include "models/registry.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/printable.h"
#include "io/weights.h"
#include "models/gemma4/gemma4.h"
#include "models/llama/llama.h"
#include "models/qwen3_5/qwen3_5.h"
#include "nn/quant_config.h"

namespace hearth::models {

namespace {
// What the registry knows of a family: how to build it, and how to validate its config alone.
struct Family {
  Factory create;
  ConfigCheck check;
};

// One line per family.
const std::map<std::string, Family>& families() {
  static const std::map<std::string, Family> table = {
      {"gemma4", {gemma4::create, gemma4::check_config}}, {"gemma4_text", {gemma4::create, gemma4::check_config}},
      {"llama", {llama::create, llama::check_config}},
      {"mistral", {llama::create, llama::check_config}},
      {"qwen2", {llama::create, llama::check_config}},
      {"qwen3", {llama::create, llama::check_config}},
      {"qwen3_5", {qwen3_5::create, qwen3_5::check_config}}, {"qwen3_5_text", {qwen3_5::create, qwen3_5::check_config}}, {"qwen3_next", {qwen3_5::create, qwen3_5::check_config}},
  };
  return table;
}

const Family& family_of(const nlohmann::json& config, const std::string& origin) {
  HEARTH_CHECK(config.is_object(), origin, ": must be a JSON object, got ", config.type_name());
  std::string type;
  if (auto it = config.find("model_type"); it != config.end()) {
    HEARTH_CHECK(it->is_string(), origin, ": model_type must be a string (e.g. \"llama\"), got ",
                 it->is_null() ? std::string("null") : std::string(it->type_name()) + " " + printable(it->dump(), 60));
    type = *it;
  }
  auto f = families().find(type);
  if (f == families().end()) {
    std::string list;
    for (const auto& name : supported_model_types()) list += (list.empty() ? "" : ", ") + name;
    throw Error(cat(origin, type.empty() ? ": missing model_type" : cat(": unsupported model_type '", printable(type, 100), "'"),
                    " (supported: ", list, ")"));
  }
  return f->second;
}
}  // namespace

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const auto& [name, f] : families()) out.push_back(name);
  return out;
}

std::unique_ptr<Model> build_model(const BuildArgs& args) { return family_of(args.config, args.origin).create(args); }

void check_config(const nlohmann::json& config, const std::string& origin) {
  nn::QuantizationConfig::from_config(config, origin);  // load_model's order: quantization, then family
  family_of(config, origin).check(config, origin);
}

std::unique_ptr<Model> load_model(const std::filesystem::path& dir, const nn::LoadOptions& opts) {
  const auto config_path = dir / "config.json";
  nlohmann::json config = io::read_json(config_path);
  io::WeightStore store = io::WeightStore::open(dir);
  nn::WeightStoreSource source(store);
  return build_model({config, config_path.string(), source,
                      nn::QuantizationConfig::from_config(config, config_path.string()), opts});
}

}  // namespace hearth::models
