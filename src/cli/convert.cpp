// `hearth convert`: rewrites a Hugging Face model folder in mlx-lm's convert layout, optionally
// casting float weights (--dtype), MLX-affine quantizing linear/embedding weights (-q) or
// dequantizing an MLX-quantized model back to float (-d).
// Follows mlx_lm.convert: cast first, then quantize; shards over 5 GB; metadata {"format": "mlx"}.
// Before any work: the flags (--q-bits/--q-group-size only with -q), the output (a new folder: not
// empty, not an existing path or dangling symlink) and the tensors against config.json (the
// loader's shape checks, on tensors without data). The output is written as OUT.tmp.PID and renamed
// into place; an error or SIGINT/SIGTERM removes it, and one left by a killed convert is removed
// by the next convert to the same OUT (cli/output_folder.h, shared with fuse).
// Not a downloader and not a format converter from GGUF/.bin.
#include <algorithm>
#include <cstring>
#include <iostream>

#include "cli/output_folder.h"
#include "cli/verb.h"
#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "io/weights.h"
#include "models/registry.h"
#include "nn/param_source.h"
#include "nn/quant.h"
#include "nn/quant_config.h"

namespace {
namespace fs = std::filesystem;
using namespace hearth;
using nlohmann::json;

struct ConvertOptions {
  std::string model, out, dtype, q_mode = "affine";
  bool quantize = false, dequantize = false;
  int bits = 4, group_size = 64;
  bool bits_given = false, group_size_given = false, q_mode_given = false;  // --q-bits / --q-group-size / --q-mode given
};

// The loader's own checks of config.json against the tensors (shapes, dtypes, layer count), run
// before converting on tensors that hold no data: every tensor a model family reads is checked
// against the shape its config gives; tensors it does not know are not. A tensor it needs that is
// missing is left to the loader (convert passes folders through as they are), as is a model_type
// Hearth does not load.
class ShapeCheckSource : public nn::ParamSource {
 public:
  struct Unchecked {};  // a tensor is missing that the family reads without a shape: stop checking
  explicit ShapeCheckSource(const io::WeightStore& ws) : ws_(ws), inner_(ws) {}
  bool contains(const std::string& name) const override { return ws_.contains(name); }
  at::Tensor get(const std::string& name, const std::vector<int64_t>& expected) const override {
    if (!ws_.contains(name)) {
      if (expected.empty()) throw Unchecked{};
      return at::empty(expected, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
    }
    const at::Tensor t = inner_.get(name, expected);  // the loader's dtype and shape checks, naming the file
    return at::empty(t.sizes(), t.options().device(at::kMeta));
  }

 private:
  const io::WeightStore& ws_;
  nn::WeightStoreSource inner_;
};

void check_against_config(const json& config, const fs::path& cfg_path, const io::WeightStore& ws,
                          const std::optional<nn::QuantizationConfig>& quant) {
  auto type = config.find("model_type");
  if (type == config.end() || !type->is_string()) return;
  const auto known = models::supported_model_types();
  if (std::find(known.begin(), known.end(), type->get<std::string>()) == known.end()) return;
  try {
    models::check_config(config, cfg_path.string());
  } catch (const Error&) {
    return;  // a config Hearth does not load (the loader says why); convert passes it through
  }
  ShapeCheckSource src(ws);
  try {
    models::build_model({config, cfg_path.string(), src, quant, {at::kMeta, at::kFloat}});
  } catch (const ShapeCheckSource::Unchecked&) {
  } catch (const c10::Error&) {
    // an operation without data this libtorch cannot run: the check is skipped, never the convert
  } catch (const Error& e) {
    throw Error(cat(e.what(), " (convert checks the weights against ", cfg_path.string(),
                    " as the loader will; the converted model would not load)"));
  }
}

constexpr uint64_t kMaxShardBytes = 5ull << 30;  // mlx-lm: max_file_size_gb = 5

std::optional<at::ScalarType> parse_dtype(const std::string& s, const std::string& where) {
  if (s.empty()) return std::nullopt;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  if (s == "f16" || s == "fp16" || s == "float16") return at::kHalf;
  if (s == "f32" || s == "fp32" || s == "float32") return at::kFloat;
  throw Error(cat(where, ": dtype '", s, "' unsupported (expected bf16, f16 or f32)"));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One output tensor, planned from the header before any data is read.
struct Planned {
  std::string source;       // input tensor name
  bool quantized = false;   // emits <module>.weight/.scales/.biases
  uint64_t bytes = 0;       // output bytes (all emitted tensors)
  std::optional<nn::QuantSpec> dequantized;  // source is <module>.weight codes: emits the float .weight
};

// Files besides weights and config that travel with a model (tokenizer, templates, generation).
bool is_companion_file(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name == "config.json" || name == "model.safetensors.index.json" || name.empty() || name[0] == '.') return false;
  const std::string ext = p.extension().string();
  return ext == ".json" || ext == ".jinja" || ext == ".txt" || ext == ".model" || ext == ".tiktoken";
}

void convert_into(const ConvertOptions& o, const fs::path& in, const fs::path& tmp) {
  const fs::path cfg_path = in / "config.json";
  json config = io::read_json(cfg_path);
  HEARTH_CHECK(config.is_object(), cfg_path.string(), ": not a JSON object");
  const auto existing = nn::QuantizationConfig::from_config(config, cfg_path.string());
  HEARTH_CHECK(!(o.quantize && existing), cfg_path.string(),
               ": model is already quantized (has a quantization block); -q needs a float model");
  HEARTH_CHECK(!o.dequantize || existing, cfg_path.string(),
               ": model is not quantized (no quantization block); -d/--dequantize needs an MLX-quantized model");
  const nn::QuantSpec spec{o.bits, o.group_size};
  if (o.quantize) nn::check_quant_spec(spec, "--q-bits/--q-group-size: quantization");

  // dtype: --dtype, else config's torch_dtype/dtype when it is a float type (as mlx-lm does).
  std::optional<at::ScalarType> dtype = parse_dtype(o.dtype, "--dtype");
  if (!dtype) {
    for (const char* key : {"torch_dtype", "dtype"}) {
      auto it = config.find(key);
      if (it != config.end() && it->is_string()) {
        const std::string v = it->get<std::string>();
        if (v == "bfloat16" || v == "float16" || v == "float32") dtype = parse_dtype(v, cfg_path.string());
        break;
      }
    }
  }

  const io::WeightStore ws = io::WeightStore::open(in);
  check_against_config(config, cfg_path, ws, existing);
  // -d: a module is quantized when its .weight has .scales beside it (mlx-lm's layout); its
  // .scales/.biases are folded into the float .weight (mlx_lm.convert --dequantize).
  auto quantized_module = [&](const std::string& name, const char* suffix) -> std::optional<std::string> {
    if (!o.dequantize || !ends_with(name, suffix)) return std::nullopt;
    const std::string module = name.substr(0, name.size() - std::strlen(suffix));
    if (!ws.contains(module + ".scales")) return std::nullopt;
    return module;
  };
  std::vector<Planned> plan;
  for (const auto& name : ws.names()) {
    if (ends_with(name, "rotary_emb.inv_freq")) continue;  // recomputed at load; mlx-lm drops it too
    if (quantized_module(name, ".scales") || quantized_module(name, ".biases")) continue;
    if (auto module = quantized_module(name, ".weight")) {
      const io::TensorInfo& w = ws.info(name);
      const io::TensorInfo& sc = ws.info(*module + ".scales");
      std::optional<nn::QuantSpec> qs = existing->spec_for(*module);
      HEARTH_CHECK(qs, in.string(), ": ", name, " has scales but config.json's quantization block does not "
                   "quantize ", *module);
      HEARTH_CHECK(w.shape.size() == 2, in.string(), ": ", name, " has scales but shape ", nn::shape_str(w.shape),
                   ", not a matrix of packed codes [rows, packed columns]");
      const uint64_t cols = static_cast<uint64_t>(w.shape[1]) * 32 / static_cast<uint64_t>(qs->bits);
      const std::vector<int64_t> want_sc = {w.shape[0], static_cast<int64_t>(cols / static_cast<uint64_t>(qs->group_size))};
      HEARTH_CHECK(sc.shape.size() == 2 && sc.shape[0] == w.shape[0] &&
                       static_cast<uint64_t>(sc.shape[1]) * static_cast<uint64_t>(qs->group_size) == cols,
                   in.string(), ": ", *module, ".scales has shape ", nn::shape_str(sc.shape), ", expected ",
                   nn::shape_str(want_sc), " for ", qs->bits, "-bit codes of group ", qs->group_size, " with shape ",
                   nn::shape_str(w.shape));
      for (const char* part : {".scales", ".biases"}) {
        const io::DType dt = ws.info(*module + part).dtype;
        HEARTH_CHECK(dt == io::DType::F32 || dt == io::DType::F16 || dt == io::DType::BF16, in.string(), ": ", *module,
                     part, " is stored as ", io::dtype_name(dt), ", not a floating-point type");
      }
      HEARTH_CHECK(w.dtype == io::DType::U32 || w.dtype == io::DType::I32, in.string(), ": ", name, " is stored as ",
                   io::dtype_name(w.dtype), "; packed codes are U32");
      const uint64_t elem = dtype ? at::elementSize(*dtype) : static_cast<uint64_t>(io::dtype_size(sc.dtype));
      Planned p{name, false, static_cast<uint64_t>(w.shape[0]) * cols * elem};
      p.dequantized = qs;
      plan.push_back(p);
      continue;
    }
    const io::TensorInfo& t = ws.info(name);
    const bool is_float = t.dtype == io::DType::F32 || t.dtype == io::DType::F16 || t.dtype == io::DType::BF16 ||
                          t.dtype == io::DType::F64;
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    const uint64_t elem = is_float && dtype ? at::elementSize(*dtype) : static_cast<uint64_t>(io::dtype_size(t.dtype));
    Planned p{name, false, numel * elem};
    if (o.quantize && is_float && ends_with(name, ".weight") && t.shape.size() == 2 &&
        t.shape[1] % o.group_size == 0) {
      const uint64_t out = static_cast<uint64_t>(t.shape[0]), cols = static_cast<uint64_t>(t.shape[1]);
      const uint64_t sbytes = dtype ? at::elementSize(*dtype) : (t.dtype == io::DType::F32 || t.dtype == io::DType::F64 ? 4 : 2);
      p.quantized = true;
      p.bytes = out * cols * o.bits / 8 + 2 * out * (cols / o.group_size) * sbytes;
    }
    plan.push_back(p);
  }
  HEARTH_CHECK(!plan.empty(), in.string(), ": no tensors to convert");

  // Shards: fill in name order, a new shard when the next tensor would pass 5 GB.
  std::vector<std::vector<const Planned*>> shards(1);
  uint64_t cur = 0, total = 0;
  for (const auto& p : plan) {
    if (cur > 0 && cur + p.bytes > kMaxShardBytes) shards.emplace_back(), cur = 0;
    shards.back().push_back(&p);
    cur += p.bytes;
    total += p.bytes;
  }
  const size_t n = shards.size();
  json weight_map = json::object();
  size_t n_quantized = 0, n_tensors = 0;
  for (size_t s = 0; s < n; ++s) {
    char fname[64];
    if (n == 1)
      std::snprintf(fname, sizeof fname, "model.safetensors");
    else
      std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", s + 1, n);
    std::map<std::string, at::Tensor> tensors;
    std::map<std::string, io::DType> stored;
    for (const Planned* p : shards[s]) {
      cli::check_output_signal();
      if (p->dequantized) {
        const std::string module = p->source.substr(0, p->source.size() - 7);
        nn::QuantizedWeight qw{ws.get(p->source), ws.get(module + ".scales"), ws.get(module + ".biases"),
                               *p->dequantized};
        tensors[p->source] = nn::dequantize(qw, dtype.value_or(qw.scales.scalar_type()));
        continue;
      }
      at::Tensor t = ws.get(p->source);
      // Only floating tensors are cast (weights, and an MLX model's scales/biases, which then keep
      // one dtype); packed codes and other integers keep their bytes and their stored label
      // (U32 is read as kInt: without the label it would be written back as I32).
      if (t.is_floating_point()) t = t.to(dtype.value_or(t.scalar_type() == at::kDouble ? at::kFloat : t.scalar_type()));
      else stored[p->source] = ws.info(p->source).dtype;
      if (p->quantized) {
        const std::string module = p->source.substr(0, p->source.size() - 7);
        nn::QuantizedWeight q = nn::quantize(t, spec);
        tensors[module + ".weight"] = q.wq;
        stored[module + ".weight"] = io::DType::U32;
        tensors[module + ".scales"] = q.scales;
        tensors[module + ".biases"] = q.biases;
        ++n_quantized;
      } else {
        tensors[p->source] = t;
      }
    }
    for (const auto& [name, _] : tensors) weight_map[name] = fname;
    n_tensors += tensors.size();
    cli::check_output_signal();
    io::save_safetensors(tmp / fname, tensors, {{"format", "mlx"}}, stored);
  }
  if (n > 1) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    io::write_file_atomic(tmp / "model.safetensors.index.json", index.dump(4) + "\n");
  }

  if (o.dequantize) {
    config.erase("quantization");
    config.erase("quantization_config");
  }
  if (o.quantize) {
    json q = {{"group_size", o.group_size}, {"bits", o.bits}, {"mode", "affine"}};
    config["quantization"] = q;
    config["quantization_config"] = q;
  }
  // The float dtype the files now hold (transformers reads torch_dtype; 5.x also writes "dtype").
  if (dtype) {
    const char* name = *dtype == at::kBFloat16 ? "bfloat16" : *dtype == at::kHalf ? "float16" : "float32";
    config["torch_dtype"] = name;
    if (config.contains("dtype")) config["dtype"] = name;
  }
  io::write_file_atomic(tmp / "config.json", config.dump(4) + "\n");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(in, ec)) {
    if (!e.is_regular_file() || !is_companion_file(e.path())) continue;
    fs::copy_file(e.path(), tmp / e.path().filename(), ec);
    HEARTH_CHECK(!ec, e.path().string(), ": cannot copy (", ec.message(), ")");
  }
  size_t n_dequantized = 0;
  for (const auto& p : plan) n_dequantized += p.dequantized ? 1 : 0;
  std::cout << "converted " << n_tensors << " tensors (" << n_quantized << " quantized";
  if (o.dequantize) std::cout << ", " << n_dequantized << " dequantized";
  if (o.quantize) std::cout << " to " << o.bits << "-bit, group " << o.group_size;
  std::cout << ") into " << n << " file(s), " << total / 1e9 << " GB\n";
}

int run_convert(const ConvertOptions& o) {
  HEARTH_CHECK(!o.out.empty(), "convert: --out is empty (name the new folder to write)");
  HEARTH_CHECK(!o.model.empty(), "convert: --model is empty (name the model folder to read)");
  // -d reads bits and group size from config.json; without -q they would do nothing.
  for (const auto& [given, flag] : {std::pair{o.bits_given, "--q-bits"}, std::pair{o.group_size_given, "--q-group-size"},
                                    std::pair{o.q_mode_given, "--q-mode"}})
    HEARTH_CHECK(!given || o.quantize, "convert: ", flag, " applies to -q/--quantize",
                 o.dequantize ? "; -d/--dequantize reads each module's bits and group size from config.json's "
                                "quantization block"
                              : " (pass -q to quantize)");
  HEARTH_CHECK(!(o.quantize && o.dequantize), "convert: -q/--quantize and -d/--dequantize exclude each other");
  const fs::path in = cli::without_trailing_slash(o.model), out = cli::without_trailing_slash(o.out);
  std::error_code ec;
  HEARTH_CHECK_T(NotFound, fs::is_directory(in, ec), in.string(), ": model folder not found");
  // A model folder would then hold another model (read as part of it by later converts, as fuse refuses).
  HEARTH_CHECK(!cli::same_or_inside(out, in), "convert: --out ", out.string(), " is (or lies inside) the --model folder ",
               in.string(), "; write the new model elsewhere");
  cli::check_new_output_folder("convert", out);
  return cli::write_new_folder("convert", out, [&] {
    io::write_dir_atomic(out, /*replace=*/false, [&](const fs::path& tmp) {
      convert_into(o, in, tmp);
      cli::check_output_signal();
    });
  });
}

std::function<int()> setup_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  // mlx_lm.convert's names too: --hf-path, --mlx-path, --q-mode (of its modes, affine only).
  app.add_option("--model,-m,--hf-path", o->model, "Input model folder (Hugging Face layout)")->required();
  app.add_option("--out,-o,--mlx-path", o->out, "Output folder (must not exist; written as OUT.tmp.PID, then renamed)")
      ->required();
  app.add_flag("-q,--quantize", o->quantize, "MLX-affine quantize linear and embedding weights");
  app.add_flag("-d,--dequantize", o->dequantize,
               "Dequantize an MLX-quantized model to float weights (in --dtype, default the scales' dtype)");
  auto* bits = app.add_option("--q-bits", o->bits, "With -q: bits per weight: 2,3,4,5,6,8")->capture_default_str();
  auto* group = app.add_option("--q-group-size", o->group_size, "With -q: quantization group size: 32,64,128")
                    ->capture_default_str();
  auto* mode = app.add_option("--q-mode", o->q_mode, "With -q: quantization mode: affine (MLX's; the only one here)")
                   ->check(CLI::IsMember({"affine"}));
  app.add_option("--dtype", o->dtype, "Cast float weights first: bf16, f16 or f32 (default: config's torch_dtype)");
  return [o, bits, group, mode] {
    o->q_mode_given = mode->count() > 0;
    o->bits_given = bits->count() > 0;
    o->group_size_given = group->count() > 0;
    return run_convert(*o);
  };
}

}  // namespace
HEARTH_REGISTER_VERB(convert, "convert", "Convert a model folder to mlx-lm layout, optionally quantized", setup_convert);
