// Adapter folders as untrusted input (POST /v1/adapters): bounded rank/alpha pattern matching,
// files confined to the allowed folders through symlinks, shapes checked from the header before
// any data is read, numbers that would overflow refused, ids with control characters refused.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>

#include "adapters/pattern_key.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "lora_test_util.h"

namespace {
namespace fs = std::filesystem;
using namespace hearth;
using namespace hearth::testing;
using nlohmann::json;

// A copy of the llama_mha golden PEFT adapter (r 4, lora_alpha 8) with its config patched.
fs::path golden_copy(const fs::path& dir, const json& patch) {
  fs::create_directories(dir);
  json cfg = io::read_json(golden_lora("llama_mha") / "adapter_config.json");
  cfg.update(patch);
  io::write_file_atomic(dir / "adapter_config.json", cfg.dump());
  fs::copy_file(golden_lora("llama_mha") / "adapter_model.safetensors", dir / "adapter_model.safetensors");
  return dir;
}

std::string load_error(const fs::path& dir, const adapters::LoadAdapterOptions& opt = {}) {
  return error_of([&] { adapters::load_adapter(dir, opt); });
}

long max_rss_kib() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

}  // namespace

// peft.utils.other.get_pattern_key: re.match(rf"(.*\.)?({key})$", module).
TEST(PatternKey, MatchesLikePeft) {
  auto m = [](const std::string& key, const std::string& module) {
    return adapters::PatternKey(key, "cfg", "rank_pattern").matches(module);
  };
  EXPECT_TRUE(m("q_proj", "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(m("self_attn.q_proj", "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(m("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(m("proj", "model.layers.0.self_attn.q_proj"));     // suffix must start after a '.'
  EXPECT_FALSE(m("self_attn", "model.layers.0.self_attn.q_proj"));  // anchored at the end
  EXPECT_TRUE(m("layers\\.[01]\\..*down_proj", "model.layers.1.mlp.down_proj"));
  EXPECT_FALSE(m("layers\\.[01]\\..*down_proj", "model.layers.2.mlp.down_proj"));
  EXPECT_TRUE(m("^model.*v_proj", "model.layers.3.self_attn.v_proj"));
  EXPECT_TRUE(m("(q|k)_proj", "model.layers.3.self_attn.k_proj"));
  const std::string msg = error_of([] { adapters::PatternKey("q_proj(", "a/adapter_config.json", "rank_pattern"); });
  EXPECT_NE(msg.find("a/adapter_config.json: rank_pattern key 'q_proj(' is not a valid regular expression"),
            std::string::npos)
      << msg;
}

// A key written to backtrack exponentially froze the engine thread for good (std::regex); now the
// match is bounded and the adapter is refused with a one-line error, at once.
TEST(PatternKey, CatastrophicKeyIsRefusedQuickly) {
  TempDir tmp;
  const std::string key = "(.+.+)+\\d_proj";
  for (const char* field : {"rank_pattern", "alpha_pattern"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string msg = load_error(golden_copy(tmp / field, {{field, {{key, 4}}}}));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << field;
    EXPECT_NE(msg.find(std::string(field) + " key '" + key + "' is too costly to match"), std::string::npos) << msg;
  }
  // Ordinary regex keys still select modules.
  auto ad = adapters::load_adapter(golden_copy(tmp / "ok", {{"r", 8}, {"rank_pattern", {{"model\\.layers\\.\\d+\\..*", 4}}},
                                                           {"alpha_pattern", {{"layers\\.1\\.mlp\\.down_proj", 40}}}}));
  EXPECT_DOUBLE_EQ(ad.modules.at("model.layers.1.mlp.down_proj").scale, 10.0);  // 40 / 4
  EXPECT_DOUBLE_EQ(ad.modules.at("model.layers.0.mlp.down_proj").scale, 2.0);   // 8 / 4
}

TEST(AdapterSafety, SymlinkedFilesMustStayInsideTheRoots) {
  TempDir tmp;
  fs::create_directories(tmp / "outside");
  fs::copy_file(golden_lora("llama_mha") / "adapter_model.safetensors", tmp / "outside" / "w.safetensors");
  io::write_file_atomic(tmp / "outside" / "passwd", "root:x:0:0:root:/root:/bin/bash\n");
  const fs::path dir = golden_copy(tmp / "allowed" / "ad", json::object());
  adapters::LoadAdapterOptions opt;
  opt.roots = {tmp / "allowed"};
  EXPECT_EQ(adapters::load_adapter(dir, opt).modules.size(), 14u);
  // The weights file is a symlink to a file outside the roots.
  fs::remove(dir / "adapter_model.safetensors");
  fs::create_symlink(tmp / "outside" / "w.safetensors", dir / "adapter_model.safetensors");
  std::string msg = load_error(dir, opt);
  EXPECT_NE(msg.find("adapter_model.safetensors: resolves (through a symlink) to a file outside the allowed folders"),
            std::string::npos)
      << msg;
  EXPECT_EQ(adapters::load_adapter(dir).modules.size(), 14u);  // no roots (CLI): allowed
  // The config is a symlink to /etc/passwd-like content: refused, and nothing of it is echoed.
  fs::remove(dir / "adapter_config.json");
  fs::create_symlink(tmp / "outside" / "passwd", dir / "adapter_config.json");
  msg = load_error(dir, opt);
  EXPECT_NE(msg.find("adapter_config.json: resolves (through a symlink) to a file outside"), std::string::npos) << msg;
  msg = load_error(dir);
  EXPECT_NE(msg.find("adapter_config.json: invalid JSON"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("root:"), std::string::npos) << msg;
  // A weights file that is really a text file outside: its bytes never appear as a "header length".
  fs::remove(dir / "adapter_config.json");
  io::write_file_atomic(dir / "adapter_config.json", io::read_file(golden_lora("llama_mha") / "adapter_config.json"));
  fs::remove(dir / "adapter_model.safetensors");
  fs::create_symlink(tmp / "outside" / "passwd", dir / "adapter_model.safetensors");
  msg = load_error(dir);
  EXPECT_NE(msg.find("adapter_model.safetensors: header length exceeds the 100 MB limit"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("root:"), std::string::npos) << msg;
}

// A sparse file whose header declares a 512 MiB lora_A: with the model's shapes, the mismatch is
// found from the header, before any tensor is copied.
TEST(AdapterSafety, ShapesAreCheckedFromTheHeaderBeforeReading) {
  TempDir tmp;
  const fs::path dir = golden_copy(tmp / "sparse", json::object());
  const int64_t in = int64_t{1} << 25;  // [4, 2^25] F32 = 512 MiB
  const std::string name = "base_model.model.model.layers.0.self_attn.q_proj.lora_";
  const uint64_t a_bytes = uint64_t(4) * in * 4, b_bytes = 64 * 4 * 4;
  json h = {{name + "A.weight", {{"dtype", "F32"}, {"shape", {4, in}}, {"data_offsets", {0, a_bytes}}}},
            {name + "B.weight", {{"dtype", "F32"}, {"shape", {64, 4}}, {"data_offsets", {a_bytes, a_bytes + b_bytes}}}}};
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  io::write_file_atomic(dir / "adapter_model.safetensors", safetensors_bytes(header, ""));
  ASSERT_EQ(::truncate((dir / "adapter_model.safetensors").c_str(), off_t(8 + header.size() + a_bytes + b_bytes)), 0);
  const adapters::ModuleShapes shapes = {{"model.layers.0.self_attn.q_proj", {64, 64}}};
  adapters::LoadAdapterOptions opt;
  opt.shapes = &shapes;
  const long rss0 = max_rss_kib();
  const std::string msg = load_error(dir, opt);
  EXPECT_NE(msg.find("module model.layers.0.self_attn.q_proj: LoRA A/B are [4, 33554432] / [64, 4], the model's "
                     "Linear is [64, 64] (out, in)"),
            std::string::npos)
      << msg;
  EXPECT_LT(max_rss_kib() - rss0, 256 * 1024) << "the tensor was read before the shape check";
  // A module the model does not have is refused the same way.
  const adapters::ModuleShapes other = {{"model.layers.9.mlp.up_proj", {64, 128}}};
  opt.shapes = &other;
  EXPECT_NE(load_error(golden_copy(tmp / "g", json::object()), opt).find("no such module in the model"),
            std::string::npos);
}

TEST(AdapterSafety, AbsurdNumbersAreRefused) {
  TempDir tmp;
  EXPECT_NE(load_error(golden_copy(tmp / "a", {{"lora_alpha", 1e308}})).find("expected a finite value of at most 10000"),
            std::string::npos);
  EXPECT_NE(load_error(golden_copy(tmp / "r", {{"r", 1e300}})).find("field 'r' must be in [1, 65536], got 1e+300"),
            std::string::npos);
  EXPECT_NE(load_error(golden_copy(tmp / "r2", {{"r", 4.5}})).find("field 'r' must be an integer, got 4.5"),
            std::string::npos);
  EXPECT_NE(load_error(golden_copy(tmp / "rp", {{"rank_pattern", {{"q_proj", 1e300}}}})).find("rank_pattern value"),
            std::string::npos);
  // mlx-lm layout: scale, rank and num_layers.
  auto ad = adapters::load_adapter(golden_lora("llama_mha"));
  adapters::save_adapter(tmp / "mlx", ad, adapters::Format::Mlx);
  json cfg = io::read_json(tmp / "mlx" / "adapter_config.json");
  const json good = cfg;
  cfg["lora_parameters"]["scale"] = 1e308;
  io::write_file_atomic(tmp / "mlx" / "adapter_config.json", cfg.dump());
  EXPECT_NE(load_error(tmp / "mlx").find("LoRA scale is 1e+308"), std::string::npos) << load_error(tmp / "mlx");
  cfg = good;
  cfg["lora_parameters"]["rank"] = 1e300;
  io::write_file_atomic(tmp / "mlx" / "adapter_config.json", cfg.dump());
  EXPECT_NE(load_error(tmp / "mlx").find("field 'rank' must be in [1, 65536]"), std::string::npos);
  cfg = good;
  cfg["num_layers"] = 9.3e18;
  io::write_file_atomic(tmp / "mlx" / "adapter_config.json", cfg.dump());
  EXPECT_NE(load_error(tmp / "mlx").find("field 'num_layers' must be in [-1, 1048576]"), std::string::npos);
}

TEST(AdapterSafety, IntegerTensorsAreRefusedByName) {
  TempDir tmp;
  const fs::path dir = golden_copy(tmp / "int", json::object());
  auto file = io::SafetensorsFile::open(golden_lora("llama_mha") / "adapter_model.safetensors");
  std::map<std::string, at::Tensor> t;
  for (const auto& info : file->tensors()) t[info.name] = file->tensor(info.name);
  t["base_model.model.model.layers.0.mlp.up_proj.lora_A.weight"] = at::ones({4, 64}, at::kInt);
  io::save_safetensors(dir / "adapter_model.safetensors", t);
  EXPECT_NE(load_error(dir).find("tensor base_model.model.model.layers.0.mlp.up_proj.lora_A.weight is stored as I32, "
                                 "expected a floating-point type"),
            std::string::npos)
      << load_error(dir);
}

TEST(AdapterSafety, IdsWithControlCharactersAreRefusedAndEscaped) {
  const std::string id("bad\0id", 6);
  const std::string msg = error_of([&] { adapters::check_adapter_id(id); });
  EXPECT_NE(msg.find("adapter 'bad\\x00id': an id must be non-empty"), std::string::npos) << msg;
  EXPECT_THROW(adapters::check_adapter_id("tab\tid"), InvalidArgument);
  EXPECT_THROW(adapters::check_adapter_id("a+b"), InvalidArgument);
  EXPECT_NO_THROW(adapters::check_adapter_id("my-adapter_1.0"));
}
