// Reading and writing LoRA adapter folders in mlx-lm's and PEFT's layouts (see adapter.h).
// Follows mlx-lm tuner/utils.py (load_adapters, linear_to_lora_layers) and peft 0.21's
// LoraConfig / save_pretrained naming. Not attaching to models (mount.cpp).
#include "adapters/adapter.h"

#include <cmath>
#include <regex>
#include <set>

#include "io/atomic_dir.h"
#include "adapters/pattern_key.h"
#include "core/error.h"
#include "core/printable.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "nn/param_source.h"

namespace hearth::adapters {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kMlxWeights = "adapters.safetensors";
constexpr const char* kPeftWeights = "adapter_model.safetensors";
constexpr const char* kConfig = "adapter_config.json";
constexpr const char* kPeftPrefix = "base_model.model.";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// JSON field readers that turn type errors into one-line hearth::Errors naming file and field.
double num_field(const json& j, const char* key, double dflt, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  HEARTH_CHECK(it->is_number(), where, ": field '", key, "' must be a number, got ", it->dump());
  return it->get<double>();
}
// An integer-valued field (JSON 8 and 8.0 alike, as Python's int() of a float) in [lo, hi]; never
// casts a value that does not fit.
int64_t int_field(const json& j, const char* key, int64_t dflt, int64_t lo, int64_t hi, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  HEARTH_CHECK(it->is_number(), where, ": field '", key, "' must be an integer, got ", printable(it->dump(), 100));
  const double v = it->get<double>();
  HEARTH_CHECK(std::isfinite(v) && v == std::floor(v), where, ": field '", key, "' must be an integer, got ",
               it->dump());
  HEARTH_CHECK(v >= double(lo) && v <= double(hi), where, ": field '", key, "' must be in [", lo, ", ", hi, "], got ",
               it->dump());
  return static_cast<int64_t>(v);
}
bool bool_field(const json& j, const char* key, bool dflt, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  HEARTH_CHECK(it->is_boolean(), where, ": field '", key, "' must be true or false, got ", it->dump());
  return it->get<bool>();
}
std::string str_field(const json& j, const char* key, const std::string& dflt, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  HEARTH_CHECK(it->is_string(), where, ": field '", key, "' must be a string, got ", it->dump());
  return it->get<std::string>();
}
std::vector<std::string> str_list(const json& j, const char* key, const std::string& where) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (it->is_string()) return {it->get<std::string>()};
  HEARTH_CHECK(it->is_array(), where, ": field '", key, "' must be a list of strings, got ", it->dump());
  for (const auto& v : *it) {
    HEARTH_CHECK(v.is_string(), where, ": field '", key, "' must be a list of strings, got ", it->dump());
    out.push_back(v.get<std::string>());
  }
  return out;
}

// Pairs "<module>.<a-suffix>" / "<module>.<b-suffix>" header entries into modules (no tensor data
// is read); any other name, a non-2-D or a non-float entry fails.
struct RawPair {
  const io::TensorInfo* a = nullptr;
  const io::TensorInfo* b = nullptr;
};
std::map<std::string, RawPair> pair_entries(const io::SafetensorsFile& file, const std::string& prefix,
                                            const std::string& a_suffix, const std::string& b_suffix) {
  std::map<std::string, RawPair> out;
  const std::string where = file.path().string();
  for (const auto& info : file.tensors()) {
    std::string name = info.name;
    if (!prefix.empty()) {
      HEARTH_CHECK(name.rfind(prefix, 0) == 0, where, ": tensor ", printable(name), " does not start with '", prefix,
                   "'");
      name = name.substr(prefix.size());
    }
    const bool is_a = ends_with(name, a_suffix), is_b = ends_with(name, b_suffix);
    HEARTH_CHECK(is_a || is_b, where, ": tensor ", printable(info.name), " is not a LoRA '", a_suffix, "'/'", b_suffix,
                 "' tensor (DoRA, biases and embedding adapters are not supported)");
    const std::string module = name.substr(0, name.size() - (is_a ? a_suffix : b_suffix).size());
    HEARTH_CHECK(info.shape.size() == 2, where, ": tensor ", printable(info.name), " has shape ",
                 nn::shape_str(info.shape), ", expected 2-D");
    HEARTH_CHECK(at::isFloatingType(io::to_scalar_type(info.dtype)), where, ": tensor ", printable(info.name),
                 " is stored as ", io::dtype_name(info.dtype), ", expected a floating-point type (F32, F16, BF16)");
    (is_a ? out[module].a : out[module].b) = &info;
  }
  for (const auto& [module, p] : out) {
    HEARTH_CHECK(p.a, where, ": module ", printable(module), " has ", b_suffix, " but no ", a_suffix);
    HEARTH_CHECK(p.b, where, ": module ", printable(module), " has ", a_suffix, " but no ", b_suffix);
  }
  HEARTH_CHECK(!out.empty(), where, ": no LoRA tensors");
  return out;
}

// Checks a module's A [r, in] / B [out, r] shapes (PEFT orientation, from the header) against the
// model's Linear when `shapes` is given, before any data is read.
void check_module_shape(const ModuleShapes* shapes, const std::string& file, const std::string& module,
                        int64_t r, int64_t in, int64_t out) {
  if (!shapes) return;
  auto it = shapes->find(module);
  HEARTH_CHECK(it != shapes->end(), file, ": module ", printable(module), ": no such module in the model");
  HEARTH_CHECK(in == it->second.first && out == it->second.second, file, ": module ", printable(module),
               ": LoRA A/B are [", r, ", ", in, "] / [", out, ", ", r, "], the model's Linear is [",
               it->second.second, ", ", it->second.first, "] (out, in)");
}

// mlx-lm's linear_to_lora_layers gives LoRA only to the `keys` modules of the last `num_layers`
// blocks, and load_weights(strict=False) ignores the file's other tensors: a module outside them
// would run here and not there, so it is refused (`keys` absent: mlx-lm's per-family default,
// not checked; num_layers -1 or 0: every block, as layers[-0:]).
void check_mlx_coverage(const LoraConfig& config, const ModuleShapes* shapes, const std::string& file,
                        const std::string& module) {
  if (!config.keys.empty()) {
    bool match = false;
    for (const auto& k : config.keys) match = match || key_matches(module, k);
    HEARTH_CHECK(match, file, ": module ", printable(module), " matches none of ", kConfig,
                 " lora_parameters.keys (mlx-lm would not load it)");
  }
  if (!shapes || config.num_layers <= 0) return;
  int64_t layers = 0;
  for (const auto& [path, shape] : *shapes) layers = std::max(layers, layer_index(path) + 1);
  const int64_t layer = layer_index(module);
  HEARTH_CHECK(layer < 0 || layer >= layers - config.num_layers, file, ": module ", printable(module), " is in block ",
               layer, ", outside the last num_layers = ", config.num_layers, " of the model's ", layers,
               " blocks (", kConfig, "; mlx-lm would not load it)");
}

// The tensor of a header entry as an owned CPU copy (read only after every header check passed).
at::Tensor load_entry(const io::SafetensorsFile& file, const io::TensorInfo* info) {
  return file.tensor(info->name).clone();
}

// PEFT's get_pattern_key: the first pattern key k (in file order) with
// re.match(r"(.*\.)?(k)$", module), matched by a bounded matcher (pattern_key.h).
struct Patterns {
  std::vector<std::pair<PatternKey, const json*>> keys;
  Patterns(const json& cfg, const char* field, const std::string& where) {
    auto it = cfg.find(field);
    if (it == cfg.end() || it->is_null()) return;
    HEARTH_CHECK(it->is_object(), where, ": field '", field, "' must be an object of pattern → value");
    for (auto e = it->begin(); e != it->end(); ++e) {
      HEARTH_CHECK(e.value().is_number(), where, ": ", field, " value for '", printable(e.key()), "' must be a number");
      keys.emplace_back(PatternKey(e.key(), where, field), &e.value());
    }
  }
  const json* find(const std::string& module) const {
    for (const auto& [key, value] : keys)
      if (key.matches(module)) return value;
    return nullptr;
  }
};

Adapter load_mlx(const fs::path& dir, const json& cfg, const std::string& where, const LoadAdapterOptions& opt) {
  Adapter ad;
  ad.fine_tune_type = str_field(cfg, "fine_tune_type", "lora", where);
  HEARTH_CHECK(ad.fine_tune_type != "full", dir.string(),
               ": full fine-tune (not a LoRA adapter): fuse it into a model with hearth fuse --model BASE "
               "--adapter-path ", dir.string(), " --out NEW, or load it with generate --adapter-path");
  HEARTH_CHECK(ad.fine_tune_type == "lora", where, ": fine_tune_type '", printable(ad.fine_tune_type),
               "' is not supported (only \"lora\")");
  HEARTH_CHECK(!bool_field(cfg, "use_dora", false, where), where, ": DoRA adapters are not supported");
  const int64_t kMaxLayers = int64_t{1} << 20;
  ad.config.num_layers =
      int_field(cfg, "num_layers", int_field(cfg, "lora_layers", -1, -1, kMaxLayers, where), -1, kMaxLayers, where);
  json lp = cfg.contains("lora_parameters") ? cfg["lora_parameters"] : json::object();
  HEARTH_CHECK(lp.is_object(), where, ": field 'lora_parameters' must be an object");
  ad.config.rank = int_field(lp, "rank", 8, 1, kMaxLoraRank, where);
  // mlx-lm's load_adapters reads config["scale"] (a KeyError when absent); a default would change
  // every output by a factor nobody chose.
  HEARTH_CHECK(lp.contains("scale"), where, ": lora_parameters.scale is missing (mlx-lm's trainer writes it, "
               "20.0 by default; its load_adapters requires it)");
  ad.config.scale = num_field(lp, "scale", 20.0, where);
  if (bool_field(lp, "rs_lora", false, where)) ad.config.scale /= std::sqrt(double(ad.config.rank));
  ad.config.dropout = num_field(lp, "dropout", 0.0, where);
  ad.config.keys = str_list(lp, "keys", where);
  ad.base_model = str_field(cfg, "base_model_name_or_path", str_field(cfg, "model", "", where), where);
  auto file = io::SafetensorsFile::open(dir / kMlxWeights, opt.roots);
  const std::string fwhere = file->path().string();
  const auto pairs = pair_entries(*file, "", ".lora_a", ".lora_b");
  for (const auto& [module, p] : pairs) {
    // mlx-lm orientation: lora_a [in, r], lora_b [r, out].
    HEARTH_CHECK(p.a->shape[1] == p.b->shape[0], fwhere, ": module ", printable(module), ": lora_a ",
                 nn::shape_str(p.a->shape), " and lora_b ", nn::shape_str(p.b->shape), " disagree on the rank");
    HEARTH_CHECK(p.a->shape[1] == ad.config.rank, fwhere, ": module ", printable(module), ": rank ", p.a->shape[1],
                 " but ", kConfig, " lora_parameters.rank is ", ad.config.rank,
                 lp.contains("rank") ? "" : " (absent: mlx-lm's default)");
    check_module_shape(opt.shapes, fwhere, module, p.a->shape[1], p.a->shape[0], p.b->shape[1]);
    check_mlx_coverage(ad.config, opt.shapes, fwhere, module);
  }
  for (const auto& [module, p] : pairs)
    ad.modules[module] = nn::LoraAdapter{load_entry(*file, p.a).t().contiguous(),
                                         load_entry(*file, p.b).t().contiguous(), ad.config.scale, ad.config.dropout};
  return ad;
}

Adapter load_peft(const fs::path& dir, const json& cfg, const std::string& where, const LoadAdapterOptions& opt) {
  Adapter ad;
  const std::string type = str_field(cfg, "peft_type", "", where);
  HEARTH_CHECK(type == "LORA", where, ": peft_type '", printable(type), "' is not supported (only \"LORA\")");
  HEARTH_CHECK(!bool_field(cfg, "use_dora", false, where), where, ": DoRA adapters are not supported");
  HEARTH_CHECK(!bool_field(cfg, "fan_in_fan_out", false, where), where, ": fan_in_fan_out adapters are not supported");
  HEARTH_CHECK(!bool_field(cfg, "lora_bias", false, where), where, ": lora_bias adapters are not supported");
  const std::string bias = str_field(cfg, "bias", "none", where);
  HEARTH_CHECK(bias == "none", where, ": bias '", printable(bias), "' is not supported (only \"none\")");
  HEARTH_CHECK(!cfg.contains("modules_to_save") || cfg["modules_to_save"].is_null() ||
                   (cfg["modules_to_save"].is_array() && cfg["modules_to_save"].empty()),
               where, ": modules_to_save is not supported (the adapter carries full module weights)");
  const int64_t r = int_field(cfg, "r", 8, 1, kMaxLoraRank, where);
  const double alpha = num_field(cfg, "lora_alpha", 8, where);
  const bool rslora = bool_field(cfg, "use_rslora", false, where);
  auto scale_of = [&](double rank, double a) { return rslora ? a / std::sqrt(rank) : a / rank; };
  ad.config.rank = r;
  ad.config.scale = scale_of(double(r), alpha);
  ad.config.dropout = num_field(cfg, "lora_dropout", 0.0, where);
  ad.config.keys = str_list(cfg, "target_modules", where);
  ad.base_model = str_field(cfg, "base_model_name_or_path", "", where);
  const Patterns rank_pattern(cfg, "rank_pattern", where), alpha_pattern(cfg, "alpha_pattern", where);
  auto file = io::SafetensorsFile::open(dir / kPeftWeights, opt.roots);
  const std::string fwhere = file->path().string();
  const auto pairs = pair_entries(*file, kPeftPrefix, ".lora_A.weight", ".lora_B.weight");
  std::map<std::string, double> scales;
  for (const auto& [module, p] : pairs) {
    // PEFT orientation: lora_A [r, in], lora_B [out, r].
    HEARTH_CHECK(p.a->shape[0] == p.b->shape[1], fwhere, ": module ", printable(module), ": lora_A ",
                 nn::shape_str(p.a->shape), " and lora_B ", nn::shape_str(p.b->shape), " disagree on the rank");
    double rank = double(r), a = alpha;
    if (const json* v = rank_pattern.find(module)) {
      rank = v->get<double>();
      HEARTH_CHECK(std::isfinite(rank) && rank == std::floor(rank) && rank >= 1 && rank <= double(kMaxLoraRank), where,
                   ": rank_pattern value for ", printable(module), " must be an integer in [1, ", kMaxLoraRank,
                   "], got ", v->dump());
    }
    if (const json* v = alpha_pattern.find(module)) a = v->get<double>();
    HEARTH_CHECK(double(p.a->shape[0]) == rank, fwhere, ": module ", printable(module), ": rank ", p.a->shape[0],
                 " but ", kConfig, " gives r = ", rank);
    scales[module] = scale_of(rank, a);
    HEARTH_CHECK(std::isfinite(scales[module]) && std::fabs(scales[module]) <= kMaxLoraScale, where, ": module ",
                 printable(module), ": LoRA scale (lora_alpha / r) is ", scales[module], ", expected a finite value of at most ",
                 kMaxLoraScale, " in magnitude");
    check_module_shape(opt.shapes, fwhere, module, p.a->shape[0], p.a->shape[1], p.b->shape[0]);
  }
  for (const auto& [module, p] : pairs)
    ad.modules[module] =
        nn::LoraAdapter{load_entry(*file, p.a), load_entry(*file, p.b), scales.at(module), ad.config.dropout};
  return ad;
}

// Module path → (block-relative suffix, layer) for "model.layers.N.<suffix>"; layer -1 otherwise.
std::pair<std::string, int64_t> split_block(const std::string& path) {
  static const std::regex re(R"(^(.*\.)?layers\.(\d+)\.(.+)$)");
  std::smatch m;
  if (std::regex_match(path, m, re)) return {m[3].str(), std::stoll(m[2].str())};
  return {path, -1};
}

// Keys that select exactly the adapter's modules when applied to every block (mlx-lm keys are
// block-relative; PEFT target_modules match by suffix); `grid` tells whether the modules form the
// full grid {layers 0..max} × {suffixes}.
std::vector<std::string> derive_keys(const Adapter& ad, bool* grid) {
  std::set<std::string> keys;
  std::map<int64_t, std::set<std::string>> per_layer;
  std::set<std::string> block_suffixes;
  for (const auto& [path, m] : ad.modules) {
    auto [suffix, layer] = split_block(path);
    keys.insert(suffix);
    if (layer >= 0) {
      per_layer[layer].insert(suffix);
      block_suffixes.insert(suffix);
    }
  }
  bool g = true;
  if (!per_layer.empty()) {
    g = per_layer.rbegin()->first + 1 == static_cast<int64_t>(per_layer.size());
    for (const auto& [layer, s] : per_layer) g = g && s == block_suffixes;
  }
  if (grid) *grid = g;
  return {keys.begin(), keys.end()};
}

json number_json(double v) {
  if (std::nearbyint(v) == v && std::fabs(v) < 1e15) return json(static_cast<int64_t>(v));
  return json(v);
}

void save_mlx(const fs::path& tmp, const Adapter& ad) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [path, m] : ad.modules) {
    HEARTH_CHECK(m.a.size(0) == ad.config.rank && std::fabs(m.scale - ad.config.scale) <= 1e-12 * std::fabs(ad.config.scale),
                 "save_adapter '", ad.id, "': module ", path,
                 " has its own rank/scale; the mlx-lm layout holds one rank and scale (save as PEFT)");
    tensors[path + ".lora_a"] = m.a.detach().t().contiguous();
    tensors[path + ".lora_b"] = m.b.detach().t().contiguous();
  }
  io::save_safetensors(tmp / kMlxWeights, tensors, {{"format", "mlx"}});
  json lp = {{"rank", ad.config.rank}, {"scale", ad.config.scale}, {"dropout", ad.config.dropout},
             {"keys", derive_keys(ad, nullptr)}};
  json cfg = {{"fine_tune_type", ad.fine_tune_type}, {"num_layers", ad.config.num_layers}, {"lora_parameters", lp}};
  if (!ad.base_model.empty()) cfg["base_model_name_or_path"] = ad.base_model;
  io::write_file_atomic(tmp / kConfig, cfg.dump(2) + "\n");
}

void save_peft(const fs::path& tmp, const Adapter& ad) {
  std::map<std::string, at::Tensor> tensors;
  json rank_pattern = json::object(), alpha_pattern = json::object();
  const double base_alpha = ad.config.scale * double(ad.config.rank);
  for (const auto& [path, m] : ad.modules) {
    tensors[kPeftPrefix + path + ".lora_A.weight"] = m.a.detach().contiguous();
    tensors[kPeftPrefix + path + ".lora_B.weight"] = m.b.detach().contiguous();
    const int64_t r = m.a.size(0);
    // Per-module patterns: the full path, matched by PEFT's "(.*\.)?(key)$" rule.
    if (r != ad.config.rank) rank_pattern[path] = r;
    const double alpha = m.scale * double(r);
    if (std::fabs(alpha - base_alpha) > 1e-9 * std::fabs(base_alpha)) alpha_pattern[path] = number_json(alpha);
  }
  io::save_safetensors(tmp / kPeftWeights, tensors, {{"format", "pt"}});
  bool grid = false;
  std::vector<std::string> targets = derive_keys(ad, &grid);
  if (!grid || ad.config.num_layers != -1) {
    targets.clear();
    for (const auto& [path, m] : ad.modules) targets.push_back(path);
  }
  json cfg = {{"peft_type", "LORA"},
              {"task_type", "CAUSAL_LM"},
              {"base_model_name_or_path", ad.base_model.empty() ? json(nullptr) : json(ad.base_model)},
              {"r", ad.config.rank},
              {"lora_alpha", number_json(base_alpha)},
              {"lora_dropout", ad.config.dropout},
              {"target_modules", targets},
              {"bias", "none"},
              {"fan_in_fan_out", false},
              {"use_rslora", false},
              {"use_dora", false},
              {"init_lora_weights", true},
              {"inference_mode", true},
              {"modules_to_save", nullptr},
              {"layers_to_transform", nullptr},
              {"layers_pattern", nullptr},
              {"rank_pattern", rank_pattern},
              {"alpha_pattern", alpha_pattern},
              {"revision", nullptr}};
  io::write_file_atomic(tmp / kConfig, cfg.dump(2) + "\n");
}

}  // namespace

const std::vector<std::string>& default_keys() {
  static const std::vector<std::string> keys = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                "mlp.down_proj"};
  return keys;
}

bool key_matches(const std::string& path, const std::string& key) {
  return path == key || (path.size() > key.size() && ends_with(path, key) && path[path.size() - key.size() - 1] == '.');
}

int64_t layer_index(const std::string& path) {
  static const std::regex re(R"(^(.*\.)?layers\.(\d+)\..+$)");
  std::smatch m;
  return std::regex_match(path, m, re) ? std::stoll(m[2].str()) : -1;
}

std::optional<std::string> resolve_module_path(const std::string& path, const std::vector<std::string>& names) {
  if (std::binary_search(names.begin(), names.end(), path)) return path;
  static const std::regex block(R"(^(.*\.)?(layers\.\d+\..+)$)");
  std::smatch m;
  const std::string bare = std::regex_match(path, m, block) ? m[2].str()
                           : path.rfind("model.", 0) == 0 ? path.substr(6) : path;
  const std::string tail = "." + bare;
  std::optional<std::string> found;
  for (const auto& n : names)
    if (n == bare || ends_with(n, tail)) {
      if (found) return std::nullopt;  // two candidates: not this rule's to choose
      found = n;
    }
  return found;
}

void check_adapter_id(const std::string& id) {
  HEARTH_CHECK_T(InvalidArgument, !id.empty() && id.find_first_of("+,") == std::string::npos && id != "none" &&
                                      !has_control_chars(id),
                 "adapter '", printable(id, 100), "': an id must be non-empty, not \"none\", and contain no '+', ',' "
                 "or control characters");
}

Adapter load_adapter(const fs::path& dir_in, const LoadAdapterOptions& options) {
  const fs::path dir = dir_in.has_filename() ? dir_in : dir_in.parent_path();
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);  // no throw: a symlink loop is an error of ours
  HEARTH_CHECK_T(NotFound, !ec || ec == std::errc::no_such_file_or_directory, dir.string(),
                 ": cannot read the adapter folder (", ec.message(), ")");
  HEARTH_CHECK_T(NotFound, fs::is_directory(st), dir.string(),
                 fs::exists(st) ? ": not a folder (an adapter is a folder holding adapter_config.json and its weights)"
                                : ": adapter folder does not exist");
  // entry_exists: a symlink loop or a dangling link is reported by the open below, not as missing.
  const bool mlx = io::entry_exists(dir / kMlxWeights), peft = io::entry_exists(dir / kPeftWeights);
  HEARTH_CHECK_T(NotFound, mlx || peft, dir.string(), ": no ", kMlxWeights, " or ", kPeftWeights);
  const fs::path cfg_path = dir / kConfig;
  HEARTH_CHECK_T(NotFound, io::entry_exists(cfg_path), cfg_path.string(), ": missing (every adapter folder needs it)");
  const json cfg = io::read_json(cfg_path, io::FileKind::kConfig, options.roots);
  const std::string where = cfg_path.string();
  HEARTH_CHECK(cfg.is_object(), where, ": must be a JSON object");
  // The config says the layout (PEFT's has peft_type); with both weight files present (a stray one
  // from another run) the config's is read, and a config of one layout beside only the other
  // layout's weights is refused (it read mlx weights with a PEFT config's scale).
  const bool peft_config = cfg.contains("peft_type");
  HEARTH_CHECK(!peft_config || peft, where, ": a PEFT config (peft_type), but the folder has no ", kPeftWeights,
               " (only mlx-lm's ", kMlxWeights, ")");
  HEARTH_CHECK(peft_config || mlx, where, ": no peft_type, so an mlx-lm config, but the folder has no ", kMlxWeights,
               " (only PEFT's ", kPeftWeights, "; a PEFT config has \"peft_type\": \"LORA\")");
  Adapter ad = peft_config ? load_peft(dir, cfg, where, options) : load_mlx(dir, cfg, where, options);
  ad.format = peft_config ? Format::Peft : Format::Mlx;
  ad.id = dir.filename().string();
  HEARTH_CHECK(ad.config.rank > 0, where, ": rank must be positive, got ", ad.config.rank);
  HEARTH_CHECK(std::isfinite(ad.config.scale) && std::fabs(ad.config.scale) <= kMaxLoraScale, where,
               ": LoRA scale is ", ad.config.scale, ", expected a finite value of at most ", kMaxLoraScale,
               " in magnitude");
  HEARTH_CHECK(ad.config.dropout >= 0.0 && ad.config.dropout < 1.0, where, ": dropout must be in [0, 1), got ",
               ad.config.dropout);
  // NaN/Inf weights would turn every answer into garbage silently.
  for (const auto& [module, m] : ad.modules)
    HEARTH_CHECK(at::isfinite(m.a).all().item<bool>() && at::isfinite(m.b).all().item<bool>(), dir.string(),
                 ": module ", printable(module), " has NaN or infinite LoRA weights");
  return ad;
}

void save_adapter(const fs::path& dir, const Adapter& adapter, Format format) {
  HEARTH_CHECK(!adapter.modules.empty(), "save_adapter '", adapter.id, "': the adapter has no modules");
  io::write_dir_atomic(dir, /*replace=*/true, [&](const fs::path& tmp) {
    if (format == Format::Mlx) save_mlx(tmp, adapter);
    else save_peft(tmp, adapter);
  });
}

}  // namespace hearth::adapters
