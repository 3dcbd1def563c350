// Adapter folders: reading PEFT 0.21's files, mlx-lm ↔ PEFT round trips (tensors transposed, values
// identical), config variants (rsLoRA, rank/alpha patterns), and one-line errors for broken
// folders. Optionally exports Hearth-saved adapters + logits for tools/check_peft_load.py.
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <limits>

#include <cstdlib>
#include <fstream>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "lora_test_util.h"

namespace {
namespace fs = std::filesystem;
using namespace hearth;
using namespace hearth::testing;
using nlohmann::json;

void expect_same_tensors(const adapters::Adapter& x, const adapters::Adapter& y) {
  ASSERT_EQ(x.modules.size(), y.modules.size());
  for (const auto& [p, m] : x.modules) {
    ASSERT_TRUE(y.modules.count(p)) << p;
    EXPECT_TRUE(at::equal(m.a, y.modules.at(p).a)) << p;
    EXPECT_TRUE(at::equal(m.b, y.modules.at(p).b)) << p;
    EXPECT_DOUBLE_EQ(m.scale, y.modules.at(p).scale) << p;
  }
}

TEST(AdapterFormat, ReadsPeftGolden) {
  auto ad = adapters::load_adapter(golden_lora("llama_mha"));
  EXPECT_EQ(ad.id, "llama_mha");
  EXPECT_EQ(ad.config.rank, 4);
  EXPECT_DOUBLE_EQ(ad.config.scale, 2.0);  // lora_alpha 8 / r 4
  EXPECT_EQ(ad.modules.size(), 14u);
  const auto& q = ad.modules.at("model.layers.0.self_attn.q_proj");
  EXPECT_EQ(q.a.sizes(), (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(q.b.sizes(), (std::vector<int64_t>{64, 4}));
  const auto& down = ad.modules.at("model.layers.1.mlp.down_proj");
  EXPECT_EQ(down.a.sizes(), (std::vector<int64_t>{4, 128}));
  // Values are the file's, untouched.
  auto file = io::SafetensorsFile::open(golden_lora("llama_mha") / "adapter_model.safetensors");
  EXPECT_TRUE(at::equal(down.b, file->tensor("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight")));
}

TEST(AdapterFormat, MlxPeftRoundTrip) {
  TempDir tmp;
  auto peft = adapters::load_adapter(golden_lora("qwen3"));
  adapters::save_adapter(tmp / "as_mlx", peft, adapters::Format::Mlx);
  // mlx-lm layout on disk: lora_a [in, r] = Aᵀ, lora_b [r, out] = Bᵀ.
  auto mlx_file = io::SafetensorsFile::open(tmp / "as_mlx" / "adapters.safetensors");
  const auto& q = peft.modules.at("model.layers.1.self_attn.k_proj");
  EXPECT_TRUE(at::equal(mlx_file->tensor("model.layers.1.self_attn.k_proj.lora_a"), q.a.t()));
  EXPECT_TRUE(at::equal(mlx_file->tensor("model.layers.1.self_attn.k_proj.lora_b"), q.b.t()));
  json cfg = io::read_json(tmp / "as_mlx" / "adapter_config.json");
  EXPECT_EQ(cfg["fine_tune_type"], "lora");
  EXPECT_EQ(cfg["num_layers"], -1);
  EXPECT_EQ(cfg["lora_parameters"]["rank"], 4);
  EXPECT_DOUBLE_EQ(cfg["lora_parameters"]["scale"].get<double>(), 2.0);
  EXPECT_EQ(cfg["lora_parameters"]["keys"].size(), 7u);  // block-relative: self_attn.q_proj, mlp.up_proj...
  EXPECT_NE(std::find(cfg["lora_parameters"]["keys"].begin(), cfg["lora_parameters"]["keys"].end(), "mlp.up_proj"),
            cfg["lora_parameters"]["keys"].end());

  auto mlx = adapters::load_adapter(tmp / "as_mlx");
  expect_same_tensors(peft, mlx);
  adapters::save_adapter(tmp / "back_to_peft", mlx, adapters::Format::Peft);
  auto back = adapters::load_adapter(tmp / "back_to_peft");
  expect_same_tensors(peft, back);
  // The re-saved PEFT file holds exactly the golden's tensors.
  auto golden = io::SafetensorsFile::open(golden_lora("qwen3") / "adapter_model.safetensors");
  auto resaved = io::SafetensorsFile::open(tmp / "back_to_peft" / "adapter_model.safetensors");
  ASSERT_EQ(golden->tensors().size(), resaved->tensors().size());
  for (const auto& info : golden->tensors()) EXPECT_TRUE(at::equal(golden->tensor(info.name), resaved->tensor(info.name)));
  json pc = io::read_json(tmp / "back_to_peft" / "adapter_config.json");
  EXPECT_EQ(pc["peft_type"], "LORA");
  EXPECT_EQ(pc["r"], 4);
  EXPECT_EQ(pc["lora_alpha"], 8);
  EXPECT_EQ(pc["target_modules"].size(), 7u);
  // Saving over an existing folder replaces it whole (no stale files).
  io::write_file_atomic(tmp / "as_mlx" / "stale.txt", "x");
  adapters::save_adapter(tmp / "as_mlx", peft, adapters::Format::Mlx);
  EXPECT_FALSE(fs::exists(tmp / "as_mlx" / "stale.txt"));
  // Non-finite weights are refused at load, naming the folder and the module.
  auto bad = peft;
  bad.modules.at("model.layers.1.self_attn.k_proj").b[0][0] = std::numeric_limits<float>::quiet_NaN();
  adapters::save_adapter(tmp / "nan", bad, adapters::Format::Mlx);
  try {
    adapters::load_adapter(tmp / "nan");
    ADD_FAILURE() << "NaN weights loaded";
  } catch (const hearth::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.self_attn.k_proj has NaN or infinite"), std::string::npos)
        << e.what();
  }
}

TEST(AdapterFormat, PartialAdapterWritesFullPathsForPeft) {
  TempDir tmp;
  auto ad = adapters::load_adapter(golden_lora("llama_mha"));
  for (auto it = ad.modules.begin(); it != ad.modules.end();)
    it = adapters::layer_index(it->first) == 0 ? ad.modules.erase(it) : std::next(it);
  ad.config.num_layers = 1;
  adapters::save_adapter(tmp / "p", ad, adapters::Format::Peft);
  json pc = io::read_json(tmp / "p" / "adapter_config.json");
  ASSERT_EQ(pc["target_modules"].size(), 7u);
  for (const auto& t : pc["target_modules"]) EXPECT_EQ(t.get<std::string>().rfind("model.layers.1.", 0), 0u) << t;
  adapters::save_adapter(tmp / "m", ad, adapters::Format::Mlx);
  EXPECT_EQ(io::read_json(tmp / "m" / "adapter_config.json")["num_layers"], 1);
  expect_same_tensors(ad, adapters::load_adapter(tmp / "m"));
}

// A copy of the llama_mha golden adapter with its config patched (and optionally its tensors).
fs::path patched_copy(const TempDir& tmp, const std::string& name, const json& patch,
                      const std::map<std::string, at::Tensor>* tensors = nullptr) {
  fs::path dir = tmp / name;
  fs::create_directories(dir);
  json cfg = io::read_json(golden_lora("llama_mha") / "adapter_config.json");
  cfg.update(patch);
  io::write_file_atomic(dir / "adapter_config.json", cfg.dump());
  if (tensors) io::save_safetensors(dir / "adapter_model.safetensors", *tensors);
  else fs::copy_file(golden_lora("llama_mha") / "adapter_model.safetensors", dir / "adapter_model.safetensors");
  return dir;
}

TEST(AdapterFormat, PeftConfigVariants) {
  TempDir tmp;
  auto rs = adapters::load_adapter(patched_copy(tmp, "rs", {{"use_rslora", true}}));
  EXPECT_DOUBLE_EQ(rs.config.scale, 4.0);  // alpha / sqrt(r) = 8 / 2
  EXPECT_DOUBLE_EQ(rs.modules.begin()->second.scale, 4.0);
  auto pat = adapters::load_adapter(patched_copy(tmp, "pat", {{"alpha_pattern", {{"down_proj", 16}}}}));
  EXPECT_DOUBLE_EQ(pat.modules.at("model.layers.0.mlp.down_proj").scale, 4.0);
  EXPECT_DOUBLE_EQ(pat.modules.at("model.layers.0.mlp.up_proj").scale, 2.0);
  // A per-module scale survives a PEFT round trip (alpha_pattern) and is refused by the mlx layout.
  adapters::save_adapter(tmp / "pat_out", pat, adapters::Format::Peft);
  expect_same_tensors(pat, adapters::load_adapter(tmp / "pat_out"));
  EXPECT_THROW(adapters::save_adapter(tmp / "pat_mlx", pat, adapters::Format::Mlx), Error);
  // rank_pattern naming the rank the tensors do not have.
  EXPECT_THROW(adapters::load_adapter(patched_copy(tmp, "rk", {{"rank_pattern", {{"q_proj", 8}}}})), Error);
}

void expect_load_error(const fs::path& dir, const std::string& needle) {
  try {
    adapters::load_adapter(dir);
    ADD_FAILURE() << "loaded a broken adapter (" << needle << ")";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(AdapterFormat, BrokenFoldersGiveOneLineErrors) {
  TempDir tmp;
  expect_load_error(tmp / "nope", "adapter folder does not exist");
  std::ofstream(tmp / "a_file") << "x";
  expect_load_error(tmp / "a_file", "a_file: not a folder");
  fs::create_symlink(tmp / "loop_b", tmp / "loop_a");
  fs::create_symlink(tmp / "loop_a", tmp / "loop_b");
  expect_load_error(tmp / "loop_a", "loop_a: cannot read the adapter folder");
  fs::create_directories(tmp / "empty");
  expect_load_error(tmp / "empty", "no adapters.safetensors or adapter_model.safetensors");
  {
    fs::path d = tmp / "nocfg";
    fs::create_directories(d);
    fs::copy_file(golden_lora("llama_mha") / "adapter_model.safetensors", d / "adapter_model.safetensors");
    expect_load_error(d, "adapter_config.json: missing");
  }
  {
    fs::path d = patched_copy(tmp, "badjson", json::object());
    io::write_file_atomic(d / "adapter_config.json", "{\"r\": 4,");
    expect_load_error(d, "adapter_config.json: invalid JSON");
  }
  expect_load_error(patched_copy(tmp, "dora", {{"use_dora", true}}), "DoRA");
  expect_load_error(patched_copy(tmp, "ia3", {{"peft_type", "IA3"}}), "peft_type 'IA3'");
  expect_load_error(patched_copy(tmp, "bias", {{"bias", "all"}}), "bias 'all'");
  expect_load_error(patched_copy(tmp, "rtype", {{"r", "four"}}), "field 'r' must be an integer");
  expect_load_error(patched_copy(tmp, "rank", {{"r", 8}}), "model.layers.0.mlp.down_proj: rank 4 but adapter_config.json gives r = 8");
  auto file = io::SafetensorsFile::open(golden_lora("llama_mha") / "adapter_model.safetensors");
  std::map<std::string, at::Tensor> t;
  for (const auto& info : file->tensors()) t[info.name] = file->tensor(info.name);
  {
    auto t2 = t;
    t2.erase("base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight");
    expect_load_error(patched_copy(tmp, "noB", json::object(), &t2), "module model.layers.1.self_attn.o_proj has .lora_A.weight but no .lora_B.weight");
  }
  {
    auto t2 = t;
    t2["base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight"] = at::zeros({64, 3});
    expect_load_error(patched_copy(tmp, "rankAB", json::object(), &t2), "model.layers.1.self_attn.o_proj: lora_A [4, 64] and lora_B [64, 3] disagree");
  }
  {
    auto t2 = t;
    t2["base_model.model.model.layers.0.mlp.gate_proj.lora_magnitude_vector"] = at::zeros({128});
    expect_load_error(patched_copy(tmp, "unknown", json::object(), &t2), "lora_magnitude_vector is not a LoRA");
  }
  {
    auto t2 = t;
    t2["base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight"] = at::zeros({4, 64, 1});
    expect_load_error(patched_copy(tmp, "3d", json::object(), &t2), "expected 2-D");
  }
  // mlx-lm layout: rank in the config disagreeing with the tensors; unsupported fine_tune_type.
  auto ad = adapters::load_adapter(golden_lora("llama_mha"));
  adapters::save_adapter(tmp / "mlx", ad, adapters::Format::Mlx);
  json cfg = io::read_json(tmp / "mlx" / "adapter_config.json");
  cfg["lora_parameters"]["rank"] = 16;
  io::write_file_atomic(tmp / "mlx" / "adapter_config.json", cfg.dump());
  expect_load_error(tmp / "mlx", "rank 4 but adapter_config.json lora_parameters.rank is 16");
  json no_rank = cfg;
  no_rank["lora_parameters"].erase("rank");
  io::write_file_atomic(tmp / "mlx" / "adapter_config.json", no_rank.dump());
  expect_load_error(tmp / "mlx", "lora_parameters.rank is 8 (absent: mlx-lm's default)");
  cfg["lora_parameters"]["rank"] = 4;
  cfg["fine_tune_type"] = "dora";
  io::write_file_atomic(tmp / "mlx" / "adapter_config.json", cfg.dump());
  expect_load_error(tmp / "mlx", "fine_tune_type 'dora'");
}

// The config names the layout: a stray weights file of the other layout is not read, and a config
// beside only the other layout's weights is refused (mlx weights were read with a PEFT scale).
TEST(AdapterFormat, TheConfigChoosesTheLayout) {
  TempDir tmp;
  auto ad = adapters::load_adapter(golden_lora("llama_mha"));
  adapters::save_adapter(tmp / "mlx", ad, adapters::Format::Mlx);
  fs::create_directories(tmp / "peft");
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors"})
    fs::copy_file(golden_lora("llama_mha") / f, tmp / "peft" / f);
  auto zeros = ad;
  for (auto& [path, m] : zeros.modules) m.b = at::zeros_like(m.b);
  adapters::save_adapter(tmp / "zeros", zeros, adapters::Format::Mlx);
  fs::copy_file(tmp / "zeros" / "adapters.safetensors", tmp / "peft" / "adapters.safetensors");  // stray
  const adapters::Adapter read = adapters::load_adapter(tmp / "peft");
  expect_same_tensors(ad, read);
  EXPECT_EQ(read.format, adapters::Format::Peft);  // what the server lists as the adapter's format
  EXPECT_EQ(adapters::load_adapter(tmp / "zeros").format, adapters::Format::Mlx);
  fs::remove(tmp / "peft" / "adapter_model.safetensors");
  expect_load_error(tmp / "peft", "a PEFT config (peft_type), but the folder has no adapter_model.safetensors");
  fs::remove(tmp / "mlx" / "adapters.safetensors");
  fs::copy_file(golden_lora("llama_mha") / "adapter_model.safetensors", tmp / "mlx" / "adapter_model.safetensors");
  expect_load_error(tmp / "mlx", "no peft_type, so an mlx-lm config, but the folder has no adapters.safetensors");
}

// mlx-lm gives LoRA only to the `keys` modules of the last `num_layers` blocks and needs `scale`:
// a file whose tensors reach outside them, or a config without a scale, is refused.
TEST(AdapterFormat, MlxConfigMustCoverItsTensors) {
  TempDir tmp;
  auto ad = adapters::load_adapter(golden_lora("llama_mha"));  // q,k,v,o,gate,up,down of blocks 0 and 1
  adapters::save_adapter(tmp / "mlx", ad, adapters::Format::Mlx);
  const json cfg = io::read_json(tmp / "mlx" / "adapter_config.json");
  auto write = [&](const json& j) { io::write_file_atomic(tmp / "mlx" / "adapter_config.json", j.dump()); };
  json no_scale = cfg;
  no_scale["lora_parameters"].erase("scale");
  write(no_scale);
  expect_load_error(tmp / "mlx", "lora_parameters.scale is missing");
  json q_only = cfg;
  q_only["lora_parameters"]["keys"] = {"self_attn.q_proj", "self_attn.v_proj"};
  write(q_only);
  expect_load_error(tmp / "mlx", "model.layers.0.mlp.down_proj matches none of adapter_config.json lora_parameters.keys");

  adapters::ModuleShapes shapes;  // the model's Linear shapes, as the server and generate pass them
  for (const auto& [path, m] : ad.modules) shapes[path] = {m.a.size(1), m.b.size(0)};
  adapters::LoadAdapterOptions with_model;
  with_model.shapes = &shapes;
  json last_one = cfg;
  last_one["num_layers"] = 1;
  write(last_one);
  EXPECT_EQ(adapters::load_adapter(tmp / "mlx").modules.size(), 14u);  // the block count is the model's
  try {
    adapters::load_adapter(tmp / "mlx", with_model);
    ADD_FAILURE() << "a block-0 module loaded under num_layers = 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is in block 0, outside the last num_layers = 1 of the model's 2 blocks"),
              std::string::npos) << e.what();
  }
  for (int n : {2, 0, -1}) {
    json all = cfg;
    all["num_layers"] = n;
    write(all);
    EXPECT_EQ(adapters::load_adapter(tmp / "mlx", with_model).modules.size(), 14u) << "num_layers " << n;
  }
}

// For tools/check_peft_load.py (run by the lead where peft is installed): with
// HEARTH_PEFT_CHECK_OUT=<dir>, writes <dir>/<name>/ (a Hearth-saved PEFT adapter for the tiny
// llama_mha model) and <dir>/logits.safetensors (Hearth's logits for <dir>/input_ids, per name).
TEST(AdapterFormat, ExportForPeftCheck) {
  const char* out = std::getenv("HEARTH_PEFT_CHECK_OUT");
  if (!out) GTEST_SKIP() << "set HEARTH_PEFT_CHECK_OUT to export adapters for tools/check_peft_load.py";
  const fs::path dir(out);
  fs::create_directories(dir);
  const at::Tensor ids = golden_batch("llama_mha").ids;
  std::map<std::string, at::Tensor> logits{{"input_ids", ids}};
  for (const auto& [name, num_layers] : {std::pair{"all_layers", int64_t{-1}}, std::pair{"last_layer", int64_t{1}}}) {
    auto model = load_tiny("llama_mha");
    adapters::LoraConfig cfg;
    cfg.rank = 4;
    cfg.scale = 2.5;
    cfg.num_layers = num_layers;
    auto ad = adapters::attach_trainable(*model, cfg, 17, name);
    {
      c10::NoGradGuard g;
      at::manual_seed(23);
      for (auto& [p, m] : ad.modules) m.b.copy_(at::randn_like(m.b) * 0.1);
    }
    ad.base_model = golden_model("llama_mha").string();
    adapters::save_adapter(dir / name, ad, adapters::Format::Peft);
    nn::ActiveAdapters scope({name});
    logits[name] = logits_of(*model, ids);
  }
  io::save_safetensors(dir / "logits.safetensors", logits);
}

}  // namespace
